//! OOM scores for real (issue 19, trick 26): the real binary with its containerd and runc
//! runs a Guaranteed, a Burstable (a 256 MiB memory request), a BestEffort pod and a pod with
//! a sidecar (a restartable init container without a request beside a regular container
//! requesting 128 MiB); each container's process is found through its cgroup's
//! `cgroup.procs` and its `/proc/<pid>/oom_score_adj` compared with upstream's formula
//! computed from the Node's memory capacity. Without `CAP_SYS_RESOURCE` (a container, also as
//! root) the kernel refuses scores below the process's `oom_score_adj_min` and containerd's
//! `restrict_oom_score_adj` raises them to containerd's own: the Guaranteed pod's -997 is then
//! expected at containerd's score, and the test says so. The harness is `common::node`.

mod common;

use std::collections::HashMap;

use common::node::{IMAGE, Node, cri_containers, missing_prerequisite, running};
use serde_json::Value;
use skerry_node::cgroups::CgroupManager;

const NODE: &str = "oom-node";

fn bytes(q: &str) -> i64 {
    let q = q.trim();
    if let Some(ki) = q.strip_suffix("Ki") {
        return ki.parse::<i64>().expect("Ki") * 1024;
    }
    if let Some(mi) = q.strip_suffix("Mi") {
        return mi.parse::<i64>().expect("Mi") << 20;
    }
    q.parse().expect("bytes")
}

fn sleeper(name: &str, resources: Value) -> Value {
    serde_json::json!({"name": name, "image": IMAGE, "command": ["sleep", "3600"],
                       "resources": resources})
}

fn pod(name: &str, init: Vec<Value>, containers: Vec<Value>) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "initContainers": init, "containers": containers}})
}

/// Upstream's Burstable formula (`pkg/kubelet/qos/policy.go`), written out again here so the
/// test does not check the code against itself: `1000 - 1000 * request / capacity`, kept in
/// 3..=999.
fn burstable(request: i64, capacity: i64) -> i64 {
    (1000 - 1000 * request / capacity).clamp(3, 999)
}

fn oom_score_adj(pid: i32) -> i64 {
    std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .expect("oom_score_adj")
        .trim()
        .parse()
        .expect("a number")
}

#[test]
fn containers_get_upstreams_oom_score_adj() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    let n: Value =
        serde_json::from_str(&node.kube.ok(&["get", "node", NODE, "-o", "json"])).expect("node");
    let capacity = bytes(n["status"]["capacity"]["memory"].as_str().expect("memory"));

    let g = serde_json::json!({"cpu": "100m", "memory": "64Mi"});
    let pods = [
        pod(
            "guaranteed",
            vec![],
            vec![sleeper(
                "c",
                serde_json::json!({"requests": g, "limits": g}),
            )],
        ),
        pod(
            "burstable",
            vec![],
            vec![sleeper(
                "c",
                serde_json::json!({"requests": {"memory": "256Mi"}}),
            )],
        ),
        pod(
            "besteffort",
            vec![],
            vec![sleeper("c", serde_json::json!({}))],
        ),
        pod(
            "sidecar",
            vec![{
                let mut s = sleeper("side", serde_json::json!({}));
                s["restartPolicy"] = "Always".into();
                s
            }],
            vec![sleeper(
                "app",
                serde_json::json!({"requests": {"memory": "128Mi"}}),
            )],
        ),
    ];
    for p in &pods {
        node.kube.ok_in(&["apply", "-f", "-"], Some(&p.to_string()));
    }

    // What the kernel lets containerd set: without CAP_SYS_RESOURCE, nothing below its own.
    let privileged = skerry_node::containerd::config::has_cap_sys_resource();
    let containerd_pid: i32 =
        std::fs::read_to_string(node.data().join("agent").join("run").join("containerd.pid"))
            .expect("containerd pid file")
            .trim()
            .parse()
            .expect("pid");
    let floor = if privileged {
        -1000
    } else {
        oom_score_adj(containerd_pid)
    };
    if !privileged {
        println!(
            "no CAP_SYS_RESOURCE: scores below containerd's {floor} are raised to it (the kernel refuses them)"
        );
    }
    let want: HashMap<(&str, &str), i64> = [
        (("guaranteed", "c"), (-997).max(floor)),
        (("burstable", "c"), burstable(256 << 20, capacity)),
        (("besteffort", "c"), 1000),
        (("sidecar", "app"), burstable(128 << 20, capacity)),
        // The sidecar requests nothing (999 on its own) and is lowered to the app's score.
        (("sidecar", "side"), burstable(128 << 20, capacity)),
    ]
    .into();
    assert!(
        burstable(128 << 20, capacity) < 999,
        "a capacity that tells them apart"
    );

    let cgroups = CgroupManager::detect().expect("cgroups");
    let mut seen = 0;
    for (name, qos) in [
        ("guaranteed", ""),
        ("burstable", "/burstable"),
        ("besteffort", "/besteffort"),
        ("sidecar", "/besteffort"),
    ] {
        let p = node.wait_pod(name, "running", running);
        let uid = p["metadata"]["uid"].as_str().expect("uid");
        // The sidecar pod is Burstable: its app container requests memory.
        let qos = if name == "sidecar" { "/burstable" } else { qos };
        let pod_cgroup = format!("{}/kubepods{qos}/pod{uid}", node.cgroup_root());
        for c in cri_containers(&node.socket(), uid) {
            let cname = c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            let pids = cgroups.pids(&format!("{pod_cgroup}/{}", c.id));
            assert!(!pids.is_empty(), "{name}/{cname}: no process in its cgroup");
            let expected = want[&(name, cname.as_str())];
            for pid in pids {
                let got = oom_score_adj(pid);
                println!("{name}/{cname} pid {pid}: oom_score_adj {got} (want {expected})");
                assert_eq!(got, expected, "{name}/{cname} pid {pid}");
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 5, "every container checked");
}
