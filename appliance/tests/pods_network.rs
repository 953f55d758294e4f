//! Pods on the pod network, for real: the real `skerry server` with its node agent and its
//! default flags (nodeipam gives the node a /24 of `--cluster-cidr`, `skerry_node::cni` writes
//! the conflist into containerd's conf dir, the runtime reports NetworkReady), the real
//! kubectl and curl, and the Debian CNI plugins (`bridge`, `host-local`, `portmap`).
//!
//! What it shows: a pod's IP is in the node's podCIDR, two pods reach each other by pod IP,
//! the host reaches a pod IP, a `hostPort` answers on the node's address, and deleting the
//! pods releases their addresses in host-local's reservations. The bridge (`cni0`) and the
//! `portmap` chains the plugins leave on the host are removed when the test ends.
//!
//! Needs root, containerd, runc, catatonit, busybox-static and the CNI plugins: a failure
//! under `CI=true`, a skip otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::free_port;
use common::kube::{Kube, tail};
use serde_json::{Value, json};
use skerry_node::cni::{self, PodRange};
use skerry_node::containerd::config::cni_bin_dir;
use skerry_node::containerd::find_on_path;
use skerry_node::images::build;

const IMAGE: &str = "skerry.test/busybox:1";
const NODE: &str = "podnet-node";
/// How long a pod gets to reach a state (image present; a loaded 2-core box running other
/// builds).
const POD_TIMEOUT: Duration = Duration::from_secs(90);
/// The port the test's httpd listens on inside its pod's own network namespace: any port
/// works there, the pod has the namespace to itself.
const HTTPD_PORT: u16 = 8080;

fn missing_prerequisite() -> bool {
    let ok = rustix::process::geteuid().is_root()
        && ["containerd", "containerd-shim-runc-v2", "runc"]
            .iter()
            .all(|b| find_on_path(b).is_some())
        && Path::new(build::BUSYBOX).exists()
        && Path::new(build::CATATONIT).exists()
        && cni::missing_plugins(&cni_bin_dir()).is_empty();
    if !ok {
        let why = "pod network tests need root, containerd, runc, catatonit, busybox-static and containernetworking-plugins";
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
        remove_plugin_leftovers();
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

/// Removes what the CNI plugins leave on the host after their pods are gone: the bridge
/// (`bridge` never deletes it) and `portmap`'s top-level NAT chains and the jumps to them
/// (its DEL removes only the pod's own `CNI-DN-*` chain).
fn remove_plugin_leftovers() {
    let _ = Command::new("ip")
        .args(["link", "del", cni::BRIDGE_DEFAULT])
        .output();
    let jumps = [
        [
            "PREROUTING",
            "-m",
            "addrtype",
            "--dst-type",
            "LOCAL",
            "-j",
            "CNI-HOSTPORT-DNAT",
        ]
        .as_slice(),
        [
            "OUTPUT",
            "-m",
            "addrtype",
            "--dst-type",
            "LOCAL",
            "-j",
            "CNI-HOSTPORT-DNAT",
        ]
        .as_slice(),
        [
            "POSTROUTING",
            "-m",
            "comment",
            "--comment",
            "CNI portfwd requiring masquerade",
            "-j",
            "CNI-HOSTPORT-MASQ",
        ]
        .as_slice(),
    ];
    for jump in jumps {
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-D"])
            .args(jump)
            .output();
    }
    let chains = Command::new("iptables")
        .args(["-t", "nat", "-S"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let ours: Vec<&str> = chains
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .filter(|c| c.starts_with("CNI-HOSTPORT-") || c.starts_with("CNI-DN-"))
        .collect();
    for chain in &ours {
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-F", chain])
            .output();
    }
    for chain in &ours {
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-X", chain])
            .output();
    }
}

fn pod_ip(p: &Value) -> Option<&str> {
    p["status"]["podIP"].as_str()
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running" && pod_ip(p).is_some()
}

/// Waits until the Node has a podCIDR and is Ready (the network configured); returns the range.
fn wait_pod_network(node: &Node) -> PodRange {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let out = node
            .kube
            .kubectl_output(&["get", "node", NODE, "-o", "json"], None);
        if out.status.success() {
            let n: Value = serde_json::from_slice(&out.stdout).expect("node JSON");
            let ready = n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if let (true, Some(cidr)) = (ready, n["spec"]["podCIDR"].as_str()) {
                return PodRange::parse(cidr).expect("a valid podCIDR");
            }
        }
        assert!(
            Instant::now() < deadline,
            "node never Ready with a podCIDR\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// GETs `url` with curl until it answers (the pod's httpd starts a moment after Running).
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

/// host-local's reservations: one file per address under `<dataDir>/<network>/`.
fn reserved_ips(node: &Node) -> Vec<String> {
    let dir = node
        .data()
        .join("agent/kubelet/cni/networks")
        .join(cni::NETWORK_NAME);
    let mut ips: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    ips.sort();
    ips
}

#[test]
fn pods_get_pod_ips_reach_each_other_and_release_them() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start();
    import_busybox(&node);
    let range = wait_pod_network(&node);

    // A web server on the pod network, with a hostPort.
    let host_port = free_port();
    let web = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "httpd", "image": IMAGE,
                "command": ["busybox", "httpd", "-f", "-p", HTTPD_PORT.to_string(), "-h", "/etc"],
                "ports": [{"containerPort": HTTPD_PORT, "hostPort": host_port}]}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&web.to_string()));
    let web = node.wait_pod("web", "Running", running);
    let web_ip = pod_ip(&web).expect("running").to_string();
    let host_ip = web["status"]["hostIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_ne!(web_ip, host_ip, "not the host network");
    assert!(
        range.contains(web_ip.parse().expect("an IP")),
        "{web_ip} outside the node's podCIDR {range}"
    );
    assert_ne!(
        web_ip,
        range.gateway().to_string(),
        "the gateway is the bridge's"
    );
    assert_eq!(web["status"]["podIPs"], json!([{"ip": web_ip}]));
    assert_eq!(reserved_ips(&node), vec![web_ip.clone()]);

    // The host reaches the pod's IP through the bridge; the pod's /etc/hosts names it.
    let hosts = curl_until(&format!("http://{web_ip}:{HTTPD_PORT}/hosts"));
    assert!(
        hosts.starts_with("# Kubernetes-managed hosts file."),
        "{hosts}"
    );
    assert!(hosts.contains(&format!("{web_ip}\tweb")), "{hosts}");

    // The hostPort answers on the node's address (portmap's DNAT).
    let by_port = curl_until(&format!("http://{host_ip}:{host_port}/hosts"));
    assert_eq!(by_port, hosts);

    // A second pod reaches the first by pod IP: busybox wget, its output in the pod's log.
    // (Debian's busybox 1.35 wget crashes with `-T`, hence `timeout`.)
    let client = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "wget", "image": IMAGE,
                "command": ["sh", "-c", format!(
                    "for i in $(seq 30); do timeout 5 wget -q -O - http://{web_ip}:{HTTPD_PORT}/hosts && exit 0; sleep 1; done; exit 1")]}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&client.to_string()));
    let client = node.wait_pod("client", "Succeeded", |p| {
        p["status"]["phase"] == "Succeeded" || p["status"]["phase"] == "Failed"
    });
    let m = &client["metadata"];
    let log_path = node.data().join(format!(
        "agent/kubelet/pods-logs/default_client_{}/wget/0.log",
        m["uid"].as_str().unwrap_or_default()
    ));
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert_eq!(
        client["status"]["phase"], "Succeeded",
        "{}\n{log}",
        client["status"]
    );
    let client_ip = pod_ip(&client).unwrap_or_default().to_string();
    assert!(
        range.contains(client_ip.parse().expect("an IP")) && client_ip != web_ip,
        "client {client_ip}, web {web_ip}"
    );
    assert!(
        log.contains(&format!("stdout F {web_ip}\tweb")),
        "{}: {log}",
        log_path.display()
    );

    // Deleting the pods tears their sandboxes down: host-local's reservations are gone.
    node.kube
        .ok(&["delete", "pod", "web", "client", "--timeout=60s"]);
    let deadline = Instant::now() + POD_TIMEOUT;
    while !reserved_ips(&node).is_empty() {
        assert!(
            Instant::now() < deadline,
            "addresses still reserved: {:?}\n{}",
            reserved_ips(&node),
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
