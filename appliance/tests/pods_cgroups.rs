//! The kubelet's cgroups for real: the real binary with its containerd and runc on this
//! machine's cgroups (v1, v2 or hybrid, as `skerry_node::cgroups` finds them), under the
//! test's own `--cgroup-root`. `kubepods` carries allocatable's memory (capacity minus
//! `--kube-reserved`) and CPU shares; a Guaranteed, a Burstable and a BestEffort pod land
//! under their QoS cgroup with the shares, CFS quota and memory limit upstream's
//! `ResourceConfigForPod` gives, read back from `/sys/fs/cgroup`; `burstable`'s shares follow
//! its pods as they come and go; a deleted pod's cgroup is gone. Then a preStop `httpGet`
//! reaches busybox httpd in the pod (its request log on a hostPath file) before the
//! container stops. Host-network pods, as the other pod tests; the harness is
//! `common::node`.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::kube::tail;
use common::node::{IMAGE, Node, POD_TIMEOUT, missing_prerequisite, running};
use serde_json::Value;
use skerry_node::cgroups::{
    CgroupManager, Layout, Observed, cpu_shares_to_weight, milli_cpu_to_shares,
};

const NODE: &str = "cgroups-node";
/// The test's `--kube-reserved` memory, which `kubepods`' limit must leave out.
const KUBE_RESERVED_MEMORY: u64 = 256 << 20;
/// The kernel keeps memory limits in whole pages (v1 `memory.limit_in_bytes` rounds down).
const PAGE: u64 = 4096;

/// A host-network pod of one busybox container sleeping, with `resources`.
fn sleeper(name: &str, resources: Value) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": IMAGE,
                                 "command": ["sleep", "3600"], "resources": resources}]}})
}

struct Cgroups {
    manager: CgroupManager,
    /// `<cgroup-root>/kubepods`.
    kubepods: String,
}

impl Cgroups {
    fn read(&self, name: &str) -> Observed {
        self.manager
            .read(name)
            .unwrap_or_else(|e| panic!("read cgroup {name}: {e}"))
    }

    /// The CPU weight or shares as this layout keeps `shares`.
    fn assert_shares(&self, name: &str, shares: u64) {
        let o = self.read(name);
        if self.manager.is_v2() {
            assert_eq!(o.cpu_weight, Some(cpu_shares_to_weight(shares)), "{name}");
        } else {
            assert_eq!(o.cpu_shares, Some(shares), "{name}");
        }
    }

    /// Waits until `name`'s shares are `shares` (the QoS cgroups are rewritten by the pod
    /// workers and housekeeping).
    fn wait_shares(&self, name: &str, shares: u64) {
        let deadline = Instant::now() + POD_TIMEOUT;
        loop {
            let o = self.read(name);
            let now = if self.manager.is_v2() {
                o.cpu_weight == Some(cpu_shares_to_weight(shares))
            } else {
                o.cpu_shares == Some(shares)
            };
            if now {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: shares {:?} / weight {:?}, want {shares}",
                o.cpu_shares,
                o.cpu_weight
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The raw file of `controller` for `name` (v1: that controller's hierarchy).
    fn file(&self, controller: &str, name: &str, file: &str) -> PathBuf {
        self.manager
            .path(controller, name)
            .expect("controller mounted")
            .join(file)
    }
}

fn bytes(q: &str) -> u64 {
    let q = q.trim();
    if let Some(ki) = q.strip_suffix("Ki") {
        return ki.parse::<u64>().expect("Ki") * 1024;
    }
    if let Some(mi) = q.strip_suffix("Mi") {
        return mi.parse::<u64>().expect("Mi") << 20;
    }
    if let Some(gi) = q.strip_suffix("Gi") {
        return gi.parse::<u64>().expect("Gi") << 30;
    }
    q.parse().expect("bytes")
}

#[test]
fn pods_land_in_their_qos_cgroups_with_their_limits() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start_with(
        NODE,
        &[
            "--kube-reserved",
            &format!("memory={}Mi", KUBE_RESERVED_MEMORY >> 20),
            "--pod-max-pids",
            "1024",
        ],
    );
    node.import_busybox();
    let cg = Cgroups {
        manager: CgroupManager::detect().expect("cgroups"),
        kubepods: format!("{}/kubepods", node.cgroup_root()),
    };

    // kubepods: capacity minus the kube reservation (not the eviction threshold), CPU shares
    // of the whole capacity (no CPU reserved).
    let n: Value =
        serde_json::from_str(&node.kube.ok(&["get", "node", NODE, "-o", "json"])).expect("node");
    let capacity = &n["status"]["capacity"];
    let memory = bytes(capacity["memory"].as_str().expect("memory"));
    let cpus: i64 = capacity["cpu"]
        .as_str()
        .expect("cpu")
        .parse()
        .expect("cpus");
    let kubepods = cg.read(&cg.kubepods);
    let want = (memory - KUBE_RESERVED_MEMORY) / PAGE * PAGE;
    assert_eq!(
        kubepods.memory,
        Some(want as i64),
        "kubepods' memory limit: allocatable without the eviction threshold"
    );
    cg.assert_shares(&cg.kubepods, milli_cpu_to_shares(cpus * 1000));
    cg.assert_shares(&format!("{}/besteffort", cg.kubepods), 2);
    // kubepods' hugetlb limits: each pool's allocatable bytes (the capacity, nothing
    // reserved), as the kubelet caps the node-allocatable cgroup; the kernel's default is
    // `max`. (This machine's pools may hold no pages: the limit is then 0.)
    let pools = skerry_node::cgroups::hugepage_sizes();
    if !pools.is_empty() && cg.manager.hugetlb_path(&cg.kubepods).is_some() {
        for size in pools {
            let resource = capacity
                .as_object()
                .into_iter()
                .flatten()
                .find(|(name, _)| {
                    skerry_node::cgroups::pod::hugepage_size(name).as_deref() == Some(size.as_str())
                })
                .map(|(_, q)| bytes(q.as_str().expect("quantity")))
                .unwrap_or(0);
            assert_eq!(
                kubepods.hugepage_limits.get(size),
                Some(&(resource as i64)),
                "kubepods' hugetlb.{size} limit: the pool's allocatable"
            );
        }
    }

    // Three pods, one of each class.
    let limits = serde_json::json!({"cpu": "200m", "memory": "64Mi"});
    for (name, resources) in [
        (
            "guaranteed",
            serde_json::json!({"requests": limits, "limits": limits}),
        ),
        (
            "burstable",
            serde_json::json!({"requests": {"cpu": "300m", "memory": "32Mi"},
                               "limits": {"memory": "128Mi"}}),
        ),
        ("besteffort", serde_json::json!({})),
    ] {
        node.kube.ok_in(
            &["apply", "-f", "-"],
            Some(&sleeper(name, resources).to_string()),
        );
    }
    let mut uids = std::collections::HashMap::new();
    for name in ["guaranteed", "burstable", "besteffort"] {
        let p = node.wait_pod(name, "running", running);
        uids.insert(
            name,
            p["metadata"]["uid"].as_str().expect("uid").to_string(),
        );
    }

    let guaranteed = format!("{}/pod{}", cg.kubepods, uids["guaranteed"]);
    cg.assert_shares(&guaranteed, 204);
    let o = cg.read(&guaranteed);
    assert_eq!(o.cpu_quota, Some(20_000), "200m of a 100 ms period");
    assert_eq!(o.cpu_period, Some(100_000));
    assert_eq!(o.memory, Some(64 << 20));
    assert_eq!(o.pids_limit, Some(1024), "--pod-max-pids");

    let burstable = format!("{}/burstable/pod{}", cg.kubepods, uids["burstable"]);
    cg.assert_shares(&burstable, 307);
    let o = cg.read(&burstable);
    assert_eq!(o.cpu_quota, Some(-1), "no CPU limit declared: no quota");
    assert_eq!(o.memory, Some(128 << 20), "every container declares memory");

    let besteffort = format!("{}/besteffort/pod{}", cg.kubepods, uids["besteffort"]);
    cg.assert_shares(&besteffort, 2);
    let o = cg.read(&besteffort);
    assert_eq!(o.cpu_quota, Some(-1));
    assert!(
        o.memory.is_none_or(|m| m == -1 || m as u64 > memory),
        "best effort: no memory limit of its own: {:?}",
        o.memory
    );

    // The raw files, as an operator reads them (v1 names on v1).
    if let Layout::V1(_) = cg.manager.layout() {
        let raw = |c: &str, n: &str, f: &str| {
            std::fs::read_to_string(cg.file(c, n, f))
                .unwrap_or_else(|e| panic!("{c} {n} {f}: {e}"))
                .trim()
                .to_string()
        };
        assert_eq!(raw("cpu", &guaranteed, "cpu.shares"), "204");
        assert_eq!(raw("cpu", &guaranteed, "cpu.cfs_quota_us"), "20000");
        assert_eq!(
            raw("memory", &guaranteed, "memory.limit_in_bytes"),
            "67108864"
        );
        // runc put the container's own cgroup below the pod's, with the container's
        // resources as CRI carried them (no swap: memsw equal to the memory limit).
        let pod_dir = cg.file("memory", &guaranteed, "");
        let container = std::fs::read_dir(&pod_dir)
            .expect("pod cgroup")
            .flatten()
            .map(|e| e.path())
            .find(|d| {
                std::fs::read_to_string(d.join("memory.limit_in_bytes"))
                    .is_ok_and(|t| t.trim() == "67108864")
            })
            .unwrap_or_else(|| panic!("no container cgroup in {}", pod_dir.display()));
        let memsw = container.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            assert_eq!(
                std::fs::read_to_string(&memsw).expect("memsw").trim(),
                "67108864"
            );
        }
        let id = container
            .file_name()
            .expect("id")
            .to_string_lossy()
            .into_owned();
        let cpu_dir = cg.file("cpu", &guaranteed, &id);
        let read = |f: &str| {
            std::fs::read_to_string(cpu_dir.join(f))
                .expect(f)
                .trim()
                .to_string()
        };
        assert_eq!(read("cpu.shares"), "204");
        assert_eq!(read("cpu.cfs_quota_us"), "20000");
    }

    // burstable follows its pods: 300m, then 300m + 500m, then 500m.
    let qos = format!("{}/burstable", cg.kubepods);
    cg.wait_shares(&qos, 307);
    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(
            &sleeper(
                "burstable2",
                serde_json::json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}),
            )
            .to_string(),
        ),
    );
    let p = node.wait_pod("burstable2", "running", running);
    let burstable2 = format!(
        "{}/burstable/pod{}",
        cg.kubepods,
        p["metadata"]["uid"].as_str().expect("uid")
    );
    cg.wait_shares(&qos, milli_cpu_to_shares(800));
    let o = cg.read(&burstable2);
    assert_eq!(
        o.cpu_quota,
        Some(100_000),
        "every container has a CPU limit"
    );
    node.kube.ok(&["delete", "pod", "burstable", "--wait=true"]);
    cg.wait_shares(&qos, milli_cpu_to_shares(500));

    // The deleted pod's cgroup is gone, in every hierarchy.
    let deadline = Instant::now() + POD_TIMEOUT;
    while cg
        .manager
        .path("cpu", &burstable)
        .is_some_and(|p| p.exists())
        || cg
            .manager
            .path("memory", &burstable)
            .is_some_and(|p| p.exists())
    {
        assert!(
            Instant::now() < deadline,
            "{burstable} still there\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        cg.manager
            .path("pids", &burstable)
            .is_none_or(|p| !p.exists())
    );
    assert!(
        cg.manager
            .path("cpu", &guaranteed)
            .is_some_and(|p| p.exists())
    );

    // A pod cgroup no pod owns (its pod deleted while the kubelet was down) is removed by
    // housekeeping; the running pods' stay.
    let stray = format!(
        "{}/besteffort/pod00000000-0000-0000-0000-000000000001",
        cg.kubepods
    );
    cg.manager
        .create(&stray, &Default::default())
        .expect("stray cgroup");
    let deadline = Instant::now() + POD_TIMEOUT;
    while cg.manager.dirs(&stray).iter().any(|d| d.exists()) {
        assert!(
            Instant::now() < deadline,
            "{stray} still there\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(cg.manager.exists(&guaranteed));
    assert!(cg.manager.exists(&besteffort));
}

/// A host-network pod running busybox httpd on `port`, its request log (`-vv`: each URL) in
/// the hostPath `www`, with a preStop `httpGet` of `path` on the port named `hook`
/// (`hook_port`) with a header.
fn hooked(name: &str, www: &Path, port: u16, hook_port: u16, path: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 3,
            "volumes": [{"name": "www", "hostPath": {"path": www.display().to_string()}}],
            "containers": [{"name": "web", "image": IMAGE,
                "command": ["sh", "-c", format!("exec httpd -f -vv -p {port} -h /www 2>>/www/{name}.log")],
                "ports": [{"name": "hook", "containerPort": hook_port}],
                "volumeMounts": [{"name": "www", "mountPath": "/www"}],
                "lifecycle": {"preStop": {"httpGet": {"path": path, "port": "hook",
                    "httpHeaders": [{"name": "X-Hook", "value": "stop"}]}}}}]}})
}

/// The events of `reason` about pod `name`.
fn events(node: &Node, name: &str, reason: &str) -> Vec<String> {
    let list: Value =
        serde_json::from_str(&node.kube.ok(&["get", "events", "-o", "json"])).expect("events");
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == reason && e["involvedObject"]["name"] == name)
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn prestop_http_get_reaches_the_pod_before_it_stops() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    let www = node.kube.dir.path().join("www");
    std::fs::create_dir_all(&www).expect("www");
    let port = common::free_port();
    let unused = common::free_port();
    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(&hooked("hooked", &www, port, port, "/prestop").to_string()),
    );
    // The second pod's hook names a port nothing listens on.
    let other = common::free_port();
    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(&hooked("missed", &www, other, unused, "/nothing").to_string()),
    );
    node.wait_pod("hooked", "running", running);
    node.wait_pod("missed", "running", running);
    // httpd answers before the hook can reach it.
    let deadline = Instant::now() + POD_TIMEOUT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "httpd never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    node.kube.ok(&["delete", "pod", "hooked", "--wait=true"]);
    let text = std::fs::read_to_string(www.join("hooked.log")).unwrap_or_default();
    assert!(
        text.contains("url:/prestop"),
        "the preStop GET reached httpd while it ran: {text:?}\n{}",
        tail(&node.kube.log())
    );
    assert!(events(&node, "hooked", "FailedPreStopHook").is_empty());

    // A hook that cannot connect is an event, and the stop goes on.
    node.kube.ok(&["delete", "pod", "missed", "--wait=true"]);
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let failed = events(&node, "missed", "FailedPreStopHook");
        if let Some(m) = failed.first() {
            assert!(
                m.starts_with(
                    "HTTP lifecycle hook (/nothing) for Container \"web\" in Pod \"missed_default("
                ) && m.contains("failed - error: "),
                "{m}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no FailedPreStopHook event\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
