//! The CPU manager's static policy for real: the real binary with `--cpu-manager-policy
//! static --reserved-cpus 0`, its containerd and runc on this machine's cgroups. A
//! Guaranteed pod asking for one whole CPU gets CPU 1 alone (its container's `cpuset.cpus`,
//! and the `Cpus_allowed_list` of its process in /proc), a Burstable pod runs on the rest
//! (CPU 0, the reserved CPU staying shared), the `cpu_manager_state` checkpoint says so, and
//! once the Guaranteed pod is deleted the reconcile loop gives the Burstable container both
//! CPUs again through CRI `UpdateContainerResources`. Needs two CPUs or more (CPU 0 and 1);
//! the harness is `common::node`.

mod common;

use std::time::{Duration, Instant};

use common::node::{IMAGE, Node, POD_TIMEOUT, missing, missing_prerequisite, running};
use serde_json::Value;
use skerry_node::cgroups::CgroupManager;
use skerry_node::checkpoint::cpu_manager::{format_cpuset, parse_cpuset};

const NODE: &str = "cpuset-node";

fn sleeper(name: &str, resources: Value) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": IMAGE,
                                 "command": ["sleep", "3600"], "resources": resources}]}})
}

/// The container's cgroup (the cgroupfs driver's name: QoS, pod, container ID).
fn container_cgroup(node: &Node, pod: &Value, qos_dir: &str) -> String {
    let uid = pod["metadata"]["uid"].as_str().expect("uid");
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .expect("containerID")
        .trim_start_matches("containerd://");
    format!("{}/kubepods{qos_dir}/pod{uid}/{id}", node.cgroup_root())
}

fn read_cpuset(cg: &CgroupManager, name: &str) -> String {
    let path = cg
        .path("cpuset", name)
        .expect("cpuset controller")
        .join("cpuset.cpus");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// The CPUs the container's first process may run on, as the kernel says.
fn allowed_cpus(cg: &CgroupManager, name: &str) -> String {
    let dir = cg.path("cpuset", name).expect("cpuset controller");
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).expect("cgroup.procs");
    let pid = procs.lines().next().expect("a process in the container");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_string()
}

#[test]
fn guaranteed_pod_gets_an_exclusive_cpu_and_the_others_share_the_rest() {
    if missing_prerequisite() {
        return;
    }
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let cpus = parse_cpuset(online.trim()).unwrap_or_default();
    if missing(
        "CPUs 0 and 1 online (the static policy needs one to reserve, one to give away)",
        cpus.contains(&0) && cpus.contains(&1),
    ) {
        return;
    }
    let all = format_cpuset(&cpus);
    let rest = format_cpuset(&cpus.iter().copied().filter(|&c| c != 1).collect());
    let node = Node::start_with(
        NODE,
        &[
            "--cpu-manager-policy",
            "static",
            "--reserved-cpus",
            "0",
            "--memory-manager-policy",
            "Static",
            // The default hard eviction threshold (memory.available<100Mi), all on node 0.
            "--reserved-memory",
            "0:memory=100Mi",
        ],
    );
    node.import_busybox();
    let cg = CgroupManager::detect().expect("cgroups");

    // --reserved-cpus 0 is the system's CPU: allocatable is one CPU less.
    let n: Value =
        serde_json::from_str(&node.kube.ok(&["get", "node", NODE, "-o", "json"])).expect("node");
    let capacity: usize = n["status"]["capacity"]["cpu"]
        .as_str()
        .and_then(|c| c.parse().ok())
        .expect("cpu capacity");
    assert_eq!(
        n["status"]["allocatable"]["cpu"].as_str(),
        Some((capacity - 1).to_string().as_str())
    );

    let whole = serde_json::json!({"cpu": "1", "memory": "64Mi"});
    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(
            &sleeper(
                "exclusive",
                serde_json::json!({"requests": whole, "limits": whole}),
            )
            .to_string(),
        ),
    );
    let g = node.wait_pod("exclusive", "running", running);
    let g_cgroup = container_cgroup(&node, &g, "");
    assert_eq!(
        read_cpuset(&cg, &g_cgroup),
        "1",
        "the Guaranteed container's own CPU"
    );
    assert_eq!(allowed_cpus(&cg, &g_cgroup), "1");

    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(
            &sleeper(
                "shared",
                serde_json::json!({"requests": {"memory": "32Mi"}}),
            )
            .to_string(),
        ),
    );
    let b = node.wait_pod("shared", "running", running);
    let b_cgroup = container_cgroup(&node, &b, "/burstable");
    assert_eq!(
        read_cpuset(&cg, &b_cgroup),
        rest,
        "the shared pool: everything but CPU 1"
    );
    assert_eq!(allowed_cpus(&cg, &b_cgroup), rest);

    // The state as upstream checkpoints it.
    let state = std::fs::read_to_string(node.data().join("agent/kubelet/cpu_manager_state"))
        .expect("cpu_manager_state");
    let state: Value = serde_json::from_str(&state).expect("JSON");
    assert_eq!(state["policyName"], "static");
    assert_eq!(state["defaultCpuSet"].as_str(), Some(rest.as_str()));
    let g_uid = g["metadata"]["uid"].as_str().expect("uid");
    assert_eq!(state["entries"][g_uid]["c"], "1");
    // The memory manager put the Guaranteed container's 64 MiB on NUMA node 0, and its
    // cpuset.mems says so.
    let memory: Value = serde_json::from_str(
        &std::fs::read_to_string(node.data().join("agent/kubelet/memory_manager_state"))
            .expect("memory_manager_state"),
    )
    .expect("JSON");
    assert_eq!(memory["policyName"], "Static");
    assert_eq!(
        memory["entries"][g_uid]["c"],
        serde_json::json!([{"numaAffinity": [0], "type": "memory", "size": 64 << 20}])
    );
    assert_eq!(
        memory["machineState"]["0"]["memoryMap"]["memory"]["systemReserved"],
        100 << 20
    );
    // Beside memory, a table per hugepage pool of node 0, its total the pool's pages read
    // from /sys (this machine's pools may hold no pages: a total of 0 is still a table).
    let pools = std::path::Path::new("/sys/devices/system/node/node0/hugepages");
    for entry in std::fs::read_dir(pools).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(kb) = name
            .strip_prefix("hugepages-")
            .and_then(|n| n.strip_suffix("kB"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let pages: u64 = std::fs::read_to_string(entry.path().join("nr_hugepages"))
            .expect("nr_hugepages")
            .trim()
            .parse()
            .expect("a page count");
        let resource = match kb {
            2048 => "hugepages-2Mi",
            1_048_576 => "hugepages-1Gi",
            _ => continue,
        };
        assert_eq!(
            memory["machineState"]["0"]["memoryMap"][resource]["total"],
            serde_json::json!(pages * kb * 1024),
            "{resource}: {memory}"
        );
    }
    let mems = cg
        .path("cpuset", &g_cgroup)
        .expect("cpuset")
        .join("cpuset.mems");
    assert_eq!(
        std::fs::read_to_string(mems).expect("cpuset.mems").trim(),
        "0"
    );

    // The Guaranteed pod goes: its CPU returns to the shared pool, and the reconcile loop
    // (10 s) writes the Burstable container's new set through CRI.
    let deleted = Instant::now();
    node.kube.ok(&["delete", "pod", "exclusive", "--wait=true"]);
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        if read_cpuset(&cg, &b_cgroup) == all {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the shared container's cpuset stayed {} (want {all})\n{}",
            read_cpuset(&cg, &b_cgroup),
            common::kube::tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(allowed_cpus(&cg, &b_cgroup), all);
    println!(
        "shared pool back to {all} {:.1} s after the delete began",
        deleted.elapsed().as_secs_f64()
    );
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(node.data().join("agent/kubelet/cpu_manager_state"))
            .expect("cpu_manager_state"),
    )
    .expect("JSON");
    assert_eq!(state["defaultCpuSet"].as_str(), Some(all.as_str()));
    assert!(state.get("entries").is_none(), "{state}");
}
