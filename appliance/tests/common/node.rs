//! The node side of the real-binary tests: [`Node`] runs `skerry server` with its node agent
//! (its own supervised containerd, runc, the pause image it builds) under a cgroup root and a
//! kubelet port of its own, imports the tests' busybox image, waits for pods, and on drop stops
//! the server with SIGTERM and removes what containerd and runc leave behind (shims, mounts,
//! cgroups), so a failing test leaves nothing running.
//!
//! These tests need root, containerd, runc, catatonit and busybox-static: a failure under
//! `CI=true` (a run that only skipped proves nothing), a skip otherwise.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use skerry_node::cni::{self, PodRange};
use skerry_node::containerd::find_on_path;
use skerry_node::images::build;
use skerry_node::testing::remove_leftovers;

use super::free_port;
use super::kube::{Kube, tail};

/// The image the tests build from busybox-static and import.
pub const IMAGE: &str = "skerry.test/busybox:1";
/// How long a pod gets to reach a state (image present; a loaded 2-core box running other
/// builds).
pub const POD_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a stopping server gets to stop its containerd before its leftovers are removed.
const STOP_TIMEOUT: Duration = Duration::from_secs(40);

/// Whether a prerequisite is missing (`ok` false): under `CI=true` a failure saying `why`,
/// otherwise a skip with that line.
pub fn missing(why: &str, ok: bool) -> bool {
    if !ok {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipping: {why}");
    }
    !ok
}

/// Whether what every pod test needs is missing (see [`missing`]).
pub fn missing_prerequisite() -> bool {
    let ok = rustix::process::geteuid().is_root()
        && ["containerd", "containerd-shim-runc-v2", "runc"]
            .iter()
            .all(|b| find_on_path(b).is_some())
        && Path::new(build::BUSYBOX).exists()
        && Path::new(build::CATATONIT).exists();
    missing(
        "pod tests need root, containerd, runc, catatonit and busybox-static",
        ok,
    )
}

/// A server with its node agent named `name` and the kubelet's API on `kubelet_port`.
pub struct Node {
    pub kube: Kube,
    /// The Node's name (`--hostname-override`).
    pub name: String,
    /// `--kubelet-port`.
    pub kubelet_port: u16,
    /// The test's own `--cgroup-root`: what is left in it is killed and removed on drop.
    cgroup_root: String,
}

impl Node {
    pub fn start(name: &str) -> Node {
        Node::start_with(name, &[])
    }

    /// [`Node::start`] with more flags of `skerry server`.
    pub fn start_with(name: &str, extra: &[&str]) -> Node {
        Node::start_prepared(name, extra, |_| {})
    }

    /// [`Node::start_with`] after `prepare` ran on the (empty) data dir.
    pub fn start_prepared(name: &str, extra: &[&str], prepare: impl FnOnce(&Path)) -> Node {
        let cgroup_root = format!(
            "/skerry-test-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        );
        let kubelet_port = free_port();
        let port = kubelet_port.to_string();
        let mut args = vec![
            "--hostname-override",
            name,
            "--cgroup-root",
            &cgroup_root,
            "--kubelet-port",
            &port,
        ];
        args.extend(extra);
        let kube = Kube::start_with_agent_prepared(&args, prepare);
        Node {
            kube,
            name: name.to_string(),
            kubelet_port,
            cgroup_root,
        }
    }

    /// The node's `--cgroup-root`.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    pub fn data(&self) -> PathBuf {
        self.kube.dir.path().join("data")
    }

    /// The supervised containerd's socket.
    pub fn socket(&self) -> PathBuf {
        self.data().join("agent/run/containerd.sock")
    }

    pub fn pod(&self, name: &str) -> Value {
        let out = self.kube.ok(&["get", "pod", name, "-o", "json"]);
        serde_json::from_str(&out).expect("pod JSON")
    }

    /// Polls the pod until `ok` holds; returns it.
    pub fn wait_pod(&self, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
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

    /// Waits until the Node is registered (and so its containerd is up).
    pub fn wait_registered(&self) {
        let deadline = Instant::now() + POD_TIMEOUT;
        while !self
            .kube
            .kubectl_output(&["get", "node", &self.name], None)
            .status
            .success()
        {
            assert!(
                Instant::now() < deadline,
                "node not registered\n{}",
                tail(&self.kube.log())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the Node has a podCIDR and is Ready (the network configured); returns the range.
    pub fn wait_pod_network(&self) -> PodRange {
        let deadline = Instant::now() + POD_TIMEOUT;
        loop {
            let out = self
                .kube
                .kubectl_output(&["get", "node", &self.name, "-o", "json"], None);
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
                tail(&self.kube.log())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Builds the busybox image and imports it with `skerry images import` once the node
    /// (and so its containerd) is up.
    pub fn import_busybox(&self) {
        self.import(&build::busybox_image(Path::new(build::BUSYBOX), IMAGE).expect("image"));
    }

    /// Imports the image `image` builds with `skerry images import` once the node (and so
    /// its containerd) is up.
    pub fn import(&self, image: &build::ImageBuilder) {
        let archive = self
            .kube
            .dir
            .path()
            .join(format!("{}.tar", rand::random::<u32>()));
        image.write_oci_archive(&archive).expect("write");
        self.wait_registered();
        let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
            .args(["images", "import", "--data-dir"])
            .arg(self.data())
            .arg(&archive)
            .output()
            .expect("skerry images import");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Removes what the CNI plugins leave on the host after their pods are gone: the bridge
/// (`bridge` never deletes it) and `portmap`'s top-level NAT chains and the jumps to them
/// (its DEL removes only the pod's own `CNI-DN-*` chain).
pub struct PluginLeftovers;

impl Drop for PluginLeftovers {
    fn drop(&mut self) {
        remove_plugin_leftovers();
    }
}

pub fn remove_plugin_leftovers() {
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

impl Drop for Node {
    fn drop(&mut self) {
        let pid = self.kube._child.0.id();
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.kube._child.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        remove_leftovers(&self.socket(), self.kube.dir.path(), &self.cgroup_root);
    }
}

pub fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running" && p["status"]["podIP"].is_string()
}

pub fn ready(p: &Value) -> bool {
    running(p)
        && p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The pod's events as `reason: message` lines.
pub fn events(node: &Node, name: &str) -> Vec<String> {
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

/// The CRI containers of the pod with `uid` on the containerd at `socket`.
pub fn cri_containers(socket: &Path, uid: &str) -> Vec<skerry_node::cri::api::Container> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let cri = skerry_node::cri::Cri::new(&socket.display().to_string()).expect("endpoint");
        cri.list_containers(Some(skerry_node::cri::api::ContainerFilter {
            label_selector: [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into(),
            ..Default::default()
        }))
        .await
        .expect("ListContainers")
    })
}

/// The CRI images on the containerd at `socket`.
pub fn cri_images(socket: &Path) -> Vec<skerry_node::cri::api::Image> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let cri = skerry_node::cri::Cri::new(&socket.display().to_string()).expect("endpoint");
        cri.list_images(None).await.expect("ListImages")
    })
}

/// A client certificate and key of `kubeconfig`'s user, written as PEM files for curl.
pub fn client_cert(node: &Node, kubeconfig: &Path, name: &str) -> (PathBuf, PathBuf) {
    let config: Value = serde_json::from_str(&node.kube.ok(&[
        "config",
        "view",
        "--raw",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "-o",
        "json",
    ]))
    .expect("kubeconfig JSON");
    let user = &config["users"][0]["user"];
    let write = |field: &str, ext: &str| {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(user[field].as_str().expect("embedded PEM"))
            .expect("base64");
        let path = node.kube.path(&format!("{name}.{ext}"));
        std::fs::write(&path, pem).expect("write PEM");
        path
    };
    (
        write("client-certificate-data", "crt"),
        write("client-key-data", "key"),
    )
}

/// `curl` to the kubelet's API: (HTTP code, body).
pub fn curl_kubelet(
    node: &Node,
    path: &str,
    cert: Option<&(PathBuf, PathBuf)>,
) -> (String, String) {
    let mut c = Command::new("curl");
    c.args(["-sk", "-w", "\n%{http_code}"]);
    if let Some((crt, key)) = cert {
        c.arg("--cert").arg(crt).arg("--key").arg(key);
    }
    let out = c
        .arg(format!("https://127.0.0.1:{}{path}", node.kubelet_port))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_string(), body.to_string())
}
