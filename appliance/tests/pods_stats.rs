//! The kubelet's `/stats/summary`, `/metrics/resource` and `/metrics` for real: the real
//! binary with its containerd and runc on this machine's cgroups runs a pod whose `hog`
//! container fills 48 MiB of the pod's `/dev/shm` (tmpfs pages, charged to its memory
//! cgroup and never inactive file cache) and whose `burner` container spins under a half-CPU
//! limit. The cluster admin's client certificate then reads, on the kubelet's port, the
//! Summary with that pod (working sets at least what it filled, CPU time and a CPU rate),
//! the resource metrics with the pod's and containers' series, and the kubelet's own
//! metrics; a user without `nodes/stats` or `nodes/metrics` gets 403. The harness is
//! `common::node`.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::node::{
    IMAGE, Node, POD_TIMEOUT, client_cert, curl_kubelet, missing_prerequisite, running,
};
use serde_json::Value;

const NODE: &str = "stats-node";
const POD: &str = "stats";
/// What `hog` puts in `/dev/shm` (below containerd's 64 MiB shm size).
const FILLED: u64 = 48 << 20;
/// How long the Summary gets to show the pod with a CPU rate: the housekeeping pass is
/// every 10 s and a rate needs two samples.
const STATS_TIMEOUT: Duration = Duration::from_secs(60);

/// One sample of a Prometheus text: (name, labels, value, timestamp).
type Sample = (String, HashMap<String, String>, f64, Option<i64>);

/// The samples of a Prometheus text (either format).
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, rest) = match line.find('}') {
            Some(end) => (&line[..=end], &line[end + 1..]),
            None => line.split_once(' ').unwrap_or((line, "")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => {
                let l = l.trim_end_matches('}');
                let labels = l
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once('=').expect("label=value");
                        (k.to_string(), v.trim_matches('"').to_string())
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (series.to_string(), HashMap::new()),
        };
        let mut f = rest.split_whitespace();
        let value: f64 = f
            .next()
            .unwrap_or_else(|| panic!("no value: {line}"))
            .parse()
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        let ts = f
            .next()
            .map(|t| t.parse().unwrap_or_else(|e| panic!("{line}: {e}")));
        out.push((name, labels, value, ts));
    }
    out
}

fn find<'a>(all: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    all.iter().find(|(n, l, _, _)| {
        n == name
            && labels
                .iter()
                .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
    })
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn stats_summary_and_metrics_show_a_pod_that_fills_memory_and_burns_cpu() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "volumes": [{"name": "scratch", "emptyDir": {}}],
                 "containers": [
                     {"name": "hog", "image": IMAGE,
                      "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                      "command": ["sh", "-c", format!(
                          "dd if=/dev/zero of=/dev/shm/fill bs=1048576 count={} && \
                           echo data > /scratch/file && exec sleep 3600", FILLED >> 20)]},
                     {"name": "burner", "image": IMAGE,
                      "resources": {"limits": {"cpu": "500m"}},
                      "command": ["sh", "-c", "while :; do :; done"]}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    let p = node.wait_pod(POD, "Running", running);
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let admin = client_cert(&node, &node.kube.kubeconfig, "admin");

    // The Summary: poll until the pod shows its filled memory and a CPU rate.
    let started = Instant::now();
    let (summary, pod_stats) = loop {
        let (code, body) = curl_kubelet(&node, "/stats/summary", Some(&admin));
        assert_eq!(code, "200", "{body}");
        let s: Value = serde_json::from_str(&body).expect("Summary JSON");
        let found = s["pods"]
            .as_array()
            .expect("pods")
            .iter()
            .find(|p| p["podRef"]["uid"] == uid.as_str())
            .cloned();
        if let Some(p) = found {
            let containers = p["containers"].as_array().map_or(0, Vec::len);
            let hog_ws = p["containers"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["name"] == "hog"))
                .and_then(|c| c["memory"]["workingSetBytes"].as_u64())
                .unwrap_or(0);
            let rated = p["cpu"]["usageNanoCores"].is_u64()
                && p["containers"]
                    .as_array()
                    .is_some_and(|c| c.iter().all(|c| c["cpu"]["usageNanoCores"].is_u64()));
            if containers == 2 && hog_ws >= FILLED && rated {
                break (s, p);
            }
        }
        assert!(
            started.elapsed() < STATS_TIMEOUT,
            "the pod never showed in the Summary with its memory and a CPU rate: {s:#}\n{}",
            common::kube::tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    println!(
        "the pod's stats after {:?}: {pod_stats:#}",
        started.elapsed()
    );
    let n = &summary["node"];
    assert_eq!(n["nodeName"], NODE);
    assert!(u(&n["cpu"]["usageCoreNanoSeconds"]) > 0);
    assert!(u(&n["memory"]["workingSetBytes"]) >= FILLED);
    assert!(u(&n["memory"]["availableBytes"]) > 0);
    assert!(u(&n["fs"]["capacityBytes"]) > 0 && n["fs"]["usedBytes"].is_u64());
    assert!(u(&n["rlimit"]["maxpid"]) > 0 && u(&n["rlimit"]["curproc"]) > 0);
    // containerd counts snapshot usage every 10 s: present, possibly still 0 this early.
    let image_fs = &n["runtime"]["imageFs"];
    assert!(
        u(&image_fs["capacityBytes"]) > 0 && image_fs["usedBytes"].is_u64(),
        "{n:#}"
    );
    let pods_container = n["systemContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "pods"))
        .expect("the pods system container");
    assert!(u(&pods_container["memory"]["workingSetBytes"]) >= FILLED);

    assert_eq!(pod_stats["podRef"]["name"], POD);
    assert_eq!(pod_stats["podRef"]["namespace"], "default");
    assert!(
        pod_stats["startTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert!(u(&pod_stats["memory"]["workingSetBytes"]) >= FILLED);
    assert!(u(&pod_stats["cpu"]["usageCoreNanoSeconds"]) > 0);
    // The burner spins under a 500m limit; a loaded box gives it less, never nothing.
    let burner = pod_stats["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "burner"))
        .expect("burner");
    let rate = u(&burner["cpu"]["usageNanoCores"]);
    assert!(
        (50_000_000..=600_000_000).contains(&rate),
        "burner's rate {rate} nanocores under a 500m limit"
    );
    assert!(u(&burner["rootfs"]["capacityBytes"]) > 0, "{burner:#}");
    assert!(burner["logs"]["usedBytes"].is_u64(), "{burner:#}");
    assert!(u(&pod_stats["process_stats"]["process_count"]) >= 2);
    let scratch = pod_stats["volume"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "scratch"))
        .expect("the emptyDir's stats");
    assert!(u(&scratch["usedBytes"]) > 0 && u(&scratch["inodesUsed"]) >= 2);
    assert!(u(&pod_stats["ephemeral-storage"]["usedBytes"]) >= u(&scratch["usedBytes"]));
    assert!(
        pod_stats["network"]["interfaces"]
            .as_array()
            .is_some_and(|i| !i.is_empty()),
        "host network: the host's interfaces: {pod_stats:#}"
    );

    // Only CPU and memory: no network, volumes or file systems.
    let (code, body) = curl_kubelet(
        &node,
        "/stats/summary?only_cpu_and_memory=true",
        Some(&admin),
    );
    assert_eq!(code, "200", "{body}");
    let small: Value = serde_json::from_str(&body).expect("JSON");
    assert!(small["node"]["fs"].is_null() && small["node"]["cpu"].is_object());
    let p = small["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["podRef"]["uid"] == uid.as_str()))
        .expect("the pod");
    assert!(p["network"].is_null() && p["volume"].is_null() && p["memory"].is_object());

    // /metrics/resource: the pod's and its containers' series, with timestamps.
    let (code, body) = curl_kubelet(&node, "/metrics/resource", Some(&admin));
    assert_eq!(code, "200", "{body}");
    let all = samples(&body);
    let labels = |c: &'static str| [("container", c), ("namespace", "default"), ("pod", POD)];
    let ws = find(&all, "container_memory_working_set_bytes", &labels("hog"))
        .unwrap_or_else(|| panic!("hog's working set: {body}"));
    assert!(ws.2 >= FILLED as f64 && ws.3.is_some(), "{ws:?}");
    let cpu = find(&all, "container_cpu_usage_seconds_total", &labels("burner")).expect("cpu");
    assert!(cpu.2 > 0.0 && cpu.3.is_some());
    let start = find(&all, "container_start_time_seconds", &labels("burner")).expect("start");
    assert!(start.2 > 1.6e9, "{start:?}");
    let pod_labels = [("namespace", "default"), ("pod", POD)];
    assert!(
        find(&all, "pod_memory_working_set_bytes", &pod_labels)
            .expect("pod ws")
            .2
            >= FILLED as f64
    );
    assert!(
        find(&all, "pod_cpu_usage_seconds_total", &pod_labels)
            .expect("pod cpu")
            .2
            > 0.0
    );
    assert!(
        find(&all, "node_cpu_usage_seconds_total", &[])
            .expect("node cpu")
            .2
            > 0.0
    );
    assert!(find(&all, "node_memory_working_set_bytes", &[]).is_some());
    assert_eq!(
        find(&all, "resource_scrape_error", &[])
            .expect("scrape error")
            .2,
        0.0
    );
    assert!(body.contains("# TYPE container_cpu_usage_seconds_total counter"));

    // /metrics: the kubelet's own.
    let (code, body) = curl_kubelet(&node, "/metrics", Some(&admin));
    assert_eq!(code, "200", "{body}");
    let all = samples(&body);
    let value = |name: &str, labels: &[(&str, &str)]| {
        find(&all, name, labels)
            .unwrap_or_else(|| panic!("{name} {labels:?} in {body}"))
            .2
    };
    assert_eq!(value("kubelet_node_name", &[("node", NODE)]), 1.0);
    assert!(value("kubelet_running_pods", &[]) >= 1.0);
    assert!(
        value(
            "kubelet_running_containers",
            &[("container_state", "running")]
        ) >= 2.0
    );
    assert!(value("kubelet_started_pods_total", &[]) >= 1.0);
    assert!(
        value(
            "kubelet_started_containers_total",
            &[("container_type", "container")]
        ) >= 2.0
    );
    assert!(value("kubelet_pod_start_duration_seconds_count", &[]) >= 1.0);
    assert!(
        value(
            "kubelet_pod_worker_duration_seconds_count",
            &[("operation_type", "create")]
        ) >= 1.0
    );
    assert!(value("kubelet_pleg_relist_duration_seconds_count", &[]) >= 1.0);
    for op in ["run_podsandbox", "list_container_stats", "start_container"] {
        assert!(
            value(
                "kubelet_runtime_operations_total",
                &[("operation_type", op)]
            ) >= 1.0
        );
        assert!(
            value(
                "kubelet_runtime_operations_duration_seconds_count",
                &[("operation_type", op)]
            ) >= 1.0
        );
    }
}

#[test]
fn stats_and_metrics_need_their_node_subresources() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
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
    let alice_cert = client_cert(&node, &alice, "alice");
    for (path, sub) in [
        ("/stats/summary", "stats"),
        ("/metrics/resource", "metrics"),
        ("/metrics", "metrics"),
    ] {
        assert_eq!(curl_kubelet(&node, path, None).0, "401", "{path}");
        assert_eq!(
            curl_kubelet(&node, path, Some(&alice_cert)),
            (
                "403".to_string(),
                format!("Forbidden (user=alice, verb=get, resource=nodes, subresource={sub})")
            ),
            "{path}"
        );
    }
    // Granted nodes/stats, alice reads the Summary but still not the metrics.
    node.kube.ok(&[
        "create",
        "clusterrole",
        "stats-reader",
        "--verb=get",
        "--resource=nodes/stats",
    ]);
    node.kube.ok(&[
        "create",
        "clusterrolebinding",
        "alice-reads-stats",
        "--clusterrole=stats-reader",
        "--user=alice",
    ]);
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let (code, body) = curl_kubelet(&node, "/stats/summary", Some(&alice_cert));
        if code == "200" {
            let s: Value = serde_json::from_str(&body).expect("Summary JSON");
            assert_eq!(s["node"]["nodeName"], NODE);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alice never read stats: {code} {body}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(curl_kubelet(&node, "/metrics", Some(&alice_cert)).0, "403");
}
