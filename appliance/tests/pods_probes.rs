//! Probes that really run (`node/src/kubelet/prober/`): the real `skerry server` with its
//! node agent and containerd, the real kubectl, a busybox image built by the test. A failing
//! readiness probe keeps a pod out of Ready, a liveness probe that starts failing restarts the
//! container, an httpGet readiness probe against busybox httpd makes a pod Ready.
//!
//! The harness (the node with its own cgroup root, the cleanup, the image import) is the one
//! of `pods.rs`. Host-network pods, as there. Needs root, containerd, runc, catatonit and
//! busybox-static: a failure under `CI=true`, a skip otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::free_port;
use common::kube::{Kube, tail};
use serde_json::Value;
use skerry_node::containerd::find_on_path;
use skerry_node::images::build;

const IMAGE: &str = "skerry.test/busybox:1";
const NODE: &str = "probes-node";
/// How long a pod gets to reach a state (image present; a loaded 2-core box running other
/// builds).
const POD_TIMEOUT: Duration = Duration::from_secs(90);

fn missing_prerequisite() -> bool {
    let ok = rustix::process::geteuid().is_root()
        && ["containerd", "containerd-shim-runc-v2", "runc"]
            .iter()
            .all(|b| find_on_path(b).is_some())
        && Path::new(build::BUSYBOX).exists()
        && Path::new(build::CATATONIT).exists();
    if !ok {
        let why = "pod tests need root, containerd, runc, catatonit and busybox-static";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipping: {why}");
    }
    !ok
}

/// A server with its node agent, stopped with SIGTERM (so it stops containerd) and its
/// leftovers (shims, mounts) removed on drop.
struct Node {
    kube: Kube,
    /// The test's own `--cgroup-root`: what is left in it is killed and removed on drop.
    cgroup_root: String,
}

impl Node {
    fn start() -> Node {
        let cgroup_root = format!(
            "/skerry-test-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        );
        let kube = Kube::start_with_agent(
            &["--hostname-override", NODE, "--cgroup-root", &cgroup_root],
            &[],
        );
        Node { kube, cgroup_root }
    }

    fn data(&self) -> PathBuf {
        self.kube.dir.path().join("data")
    }

    fn socket(&self) -> PathBuf {
        self.data().join("agent/run/containerd.sock")
    }

    fn pod(&self, name: &str) -> Value {
        let out = self.kube.ok(&["get", "pod", name, "-o", "json"]);
        serde_json::from_str(&out).expect("pod JSON")
    }

    /// Polls the pod until `ok` holds; returns it.
    fn wait_pod(&self, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + POD_TIMEOUT;
        loop {
            let out = self
                .kube
                .kubectl_output(&["get", "pod", name, "-o", "json"], None);
            if out.status.success() {
                let pod: Value = serde_json::from_slice(&out.stdout).expect("pod JSON");
                if ok(&pod) {
                    return pod;
                }
                if Instant::now() > deadline {
                    panic!(
                        "pod {name} not {what} in {POD_TIMEOUT:?}: {}\n{}",
                        serde_json::to_string_pretty(&pod["status"]).unwrap_or_default(),
                        tail(&self.kube.log())
                    );
                }
            } else if Instant::now() > deadline {
                panic!("pod {name} not {what}\n{}", tail(&self.kube.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let pid = self.kube._child.0.id();
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.kube._child.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        cleanup(&self.socket(), self.kube.dir.path(), &self.cgroup_root);
    }
}

/// Kills the shims of this test's containerd and the processes left in the test's cgroups,
/// removes those cgroups, and unmounts what the node mounted under the test's directory.
fn cleanup(socket: &Path, dir: &Path, cgroup_root: &str) {
    let socket = socket.display().to_string();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline);
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let in_test_cgroup = cgroups.lines().any(|l| {
            l.split(':')
                .nth(2)
                .is_some_and(|p| p.starts_with(&format!("{cgroup_root}/")))
        });
        if (text.contains(&socket) || in_test_cgroup)
            && let Some(p) = rustix::process::Pid::from_raw(pid)
        {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.display().to_string();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = rustix::mount::unmount(p, rustix::mount::UnmountFlags::DETACH);
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup").join(cgroup_root.trim_start_matches('/'))];
    for entry in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        roots.push(entry.path().join(cgroup_root.trim_start_matches('/')));
    }
    for root in roots {
        remove_cgroup_tree(&root);
    }
}

fn remove_cgroup_tree(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn import_busybox(node: &Node) {
    let archive = node.kube.dir.path().join("busybox.tar");
    build::busybox_image(Path::new(build::BUSYBOX), IMAGE)
        .expect("image")
        .write_oci_archive(&archive)
        .expect("write");
    // containerd is up once the node registered.
    let deadline = Instant::now() + POD_TIMEOUT;
    while !node
        .kube
        .kubectl_output(&["get", "node", NODE], None)
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "node not registered\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(["images", "import", "--data-dir"])
        .arg(node.data())
        .arg(&archive)
        .output()
        .expect("skerry images import");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running" && p["status"]["podIP"].is_string()
}

fn ready(p: &Value) -> bool {
    running(p)
        && p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Creates a host-network pod from a JSON spec.
fn create(node: &Node, name: &str, containers: Value) {
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 2,
            "containers": containers,
        }
    });
    node.kube
        .ok_in(&["create", "-f", "-"], Some(&pod.to_string()));
}

/// The pod's events as `reason: message` lines.
fn events(node: &Node, name: &str) -> Vec<String> {
    let out = node.kube.ok(&["get", "events", "-o", "json"]);
    let list: Value = serde_json::from_str(&out).expect("event list");
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["involvedObject"]["name"] == name)
        .map(|e| {
            format!(
                "{}: {}",
                e["reason"].as_str().unwrap_or_default(),
                e["message"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

fn wait_event(node: &Node, name: &str, prefix: &str) -> String {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let all = events(node, name);
        if let Some(e) = all.iter().find(|e| e.starts_with(prefix)) {
            return e.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no event {prefix:?} for {name}: {all:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn condition(p: &Value, type_: &str) -> String {
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn probes_gate_readiness_and_restart_unhealthy_containers() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start();
    import_busybox(&node);
    let port = free_port();

    // A readiness probe that always fails: the pod runs but never becomes Ready.
    create(
        &node,
        "unready",
        serde_json::json!([{
            "name": "c",
            "image": IMAGE,
            "command": ["sleep", "3600"],
            "readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1},
        }]),
    );
    // A liveness probe that passes for a few seconds, then fails: the container restarts.
    create(
        &node,
        "liveness",
        serde_json::json!([{
            "name": "c",
            "image": IMAGE,
            "command": ["sh", "-c", "touch /tmp/healthy; sleep 4; rm /tmp/healthy; exec sleep 3600"],
            "livenessProbe": {
                "exec": {"command": ["cat", "/tmp/healthy"]},
                "periodSeconds": 1,
                "failureThreshold": 2,
            },
        }]),
    );
    // busybox httpd behind an httpGet readiness probe by port name: Ready once it serves.
    create(
        &node,
        "web",
        serde_json::json!([{
            "name": "c",
            "image": IMAGE,
            "command": ["sh", "-c", format!("mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p {port} -h /www")],
            "ports": [{"name": "http", "containerPort": port}],
            "readinessProbe": {
                "httpGet": {"port": "http", "path": "/index.html"},
                "periodSeconds": 1,
            },
        }]),
    );

    let web = node.wait_pod("web", "Ready", ready);
    assert_eq!(web["status"]["containerStatuses"][0]["ready"], true);
    assert_eq!(web["status"]["containerStatuses"][0]["started"], true);

    node.wait_pod("unready", "Running", running);
    // Several probe periods later it is still not Ready, and says why.
    wait_event(&node, "unready", "Unhealthy: Readiness probe failed");
    std::thread::sleep(Duration::from_secs(3));
    let unready = node.pod("unready");
    assert_eq!(unready["status"]["phase"], "Running");
    assert_eq!(condition(&unready, "Ready"), "False", "{unready:#}");
    assert_eq!(condition(&unready, "ContainersReady"), "False");
    let cs = &unready["status"]["containerStatuses"][0];
    assert_eq!(cs["ready"], false, "{cs}");
    assert_eq!(
        cs["restartCount"], 0,
        "a readiness failure restarts nothing"
    );

    let restarted = node.wait_pod("liveness", "restarted", |p| {
        p["status"]["containerStatuses"][0]["restartCount"]
            .as_i64()
            .is_some_and(|n| n >= 1)
    });
    let cs = &restarted["status"]["containerStatuses"][0];
    assert_eq!(
        cs["lastState"]["terminated"]["exitCode"], 137,
        "killed, not exited: {cs}"
    );
    let unhealthy = wait_event(&node, "liveness", "Unhealthy: Liveness probe failed: ");
    assert!(unhealthy.contains("/tmp/healthy"), "{unhealthy}");
    wait_event(
        &node,
        "liveness",
        "Killing: Container c failed liveness probe, will be restarted",
    );
    // The new instance runs and is probed afresh (alive again for its first seconds).
    node.wait_pod("liveness", "running again", |p| {
        running(p) && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    });
}

#[test]
fn a_pod_bound_past_the_scheduler_that_asks_too_much_is_rejected() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start();
    import_busybox(&node);
    let n: Value = serde_json::from_str(&node.kube.ok(&["get", "node", NODE, "-o", "json"]))
        .expect("node JSON");
    let allocatable = n["status"]["allocatable"]["cpu"]
        .as_str()
        .expect("allocatable cpu")
        .to_string();
    // More CPUs than the node has, bound by name: the scheduler never sees it.
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "greedy"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "containers": [{
                "name": "c",
                "image": IMAGE,
                "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "1000"}},
            }],
        }
    });
    node.kube
        .ok_in(&["create", "-f", "-"], Some(&pod.to_string()));
    let rejected = node.wait_pod("greedy", "Failed", |p| p["status"]["phase"] == "Failed");
    assert_eq!(rejected["status"]["reason"], "OutOfcpu", "{rejected:#}");
    let millis = if let Some(m) = allocatable.strip_suffix('m') {
        m.parse::<i64>().expect("millicores")
    } else {
        allocatable.parse::<i64>().expect("cores") * 1000
    };
    assert_eq!(
        rejected["status"]["message"],
        format!(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000000, used: 0, capacity: {millis}"
        )
    );
    wait_event(
        &node,
        "greedy",
        "OutOfcpu: Node didn't have enough resource: cpu",
    );
    // Nothing of it ever ran.
    assert!(
        rejected["status"]["containerStatuses"].is_null(),
        "{rejected:#}"
    );
}
