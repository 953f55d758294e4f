//! Three boxes on one switch, on one machine: [`Boxes`] creates a network namespace for the
//! switch (a Linux bridge `br0` with the outside address [`OUTSIDE_IP`]) and one per box
//! (`<prefix>-a`, `-b`, `-c`), each joined to the bridge by a veth pair and addressed on one
//! /24 ([`SEGMENT`]). Each box runs `skerry server` as one member of a three-member Raft
//! cluster, with its node agent (its own containerd, cgroup root and data dir), the Node named
//! after the box (`a`, `b`, `c`), and the busybox test image imported.
//!
//! Why a namespace for the switch rather than a bridge in the host: nothing of the host is
//! touched at all (no link, address or route appears in it, whatever the test's addresses),
//! the outside server is just a socket in that namespace, and deleting the namespaces removes
//! every link at once, also after a crashed run.
//!
//! Why `nsenter --net` rather than `ip netns exec`: the latter also unshares the mount
//! namespace and remounts `/sys`, which hides `/sys/fs/cgroup` from containerd and runc; with
//! `nsenter --net` only the network is the box's, and the cgroups, mounts and shims are found
//! and removed on drop by the same clean-up as [`super::node::Node`]'s.
//!
//! Each server runs the node's network itself (routes, masquerade, the service proxy, cluster
//! DNS), as on a real box.
//!
//! Dropping [`Boxes`] sends SIGTERM to the three servers (so each
//! stops its containerd), waits, removes their leftovers (shims, mounts, cgroups) and deletes
//! the namespaces.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skerry_node::images::build;
use skerry_node::testing::remove_leftovers;

use super::kube::{KUBECTL, KilledOnDrop, READY_TIMEOUT, tail};
use super::node::{IMAGE, POD_TIMEOUT};

/// The box names, which are also their Raft member and Node names.
pub const NAMES: [&str; 3] = ["a", "b", "c"];
/// The boxes' segment. Any /24 works: it exists only inside the test's namespaces.
pub const SEGMENT: &str = "10.77.0.0/24";
/// The switch's own address on the segment: "outside the cluster" for the pods.
pub const OUTSIDE_IP: &str = "10.77.0.254";
/// The segment's prefix length.
const SEGMENT_PREFIX: u8 = 24;
/// The pods' range (`--cluster-cidr`), k3s's default, disjoint from [`SEGMENT`].
pub const CLUSTER_CIDR: &str = "10.42.0.0/16";
/// etcd's client port inside each box (each box has its own port space).
const CLIENT_PORT: u16 = 2379;
/// etcd's peer port (Raft) inside each box.
const PEER_PORT: u16 = 2380;
/// The Kubernetes API inside each box.
const API_PORT: u16 = 6443;
/// The kubelet's port inside each box (the kubelet's default).
const KUBELET_PORT: u16 = 10250;
/// `--eviction-hard` for the boxes (the build machine's disk is often nearly full of target
/// dirs; see `kube.rs`'s `EVICTION_HARD_FOR_TESTS`).
const EVICTION_HARD: &str =
    "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%";
/// How long stopping servers get to stop their containerds before leftovers are removed.
const STOP_TIMEOUT: Duration = Duration::from_secs(40);

/// The address of box `i` (0, 1, 2) on the segment.
pub fn box_ip(i: usize) -> String {
    format!("10.77.0.{}", i + 1)
}

/// The second segment of [`Layout::ThirdBehindRouter`], where box c sits alone.
pub const FAR_SEGMENT: &str = "10.78.0.0/24";
/// Box c's address there.
pub const FAR_BOX_IP: &str = "10.78.0.3";
/// The switch's address on the second segment: the router between the two.
pub const FAR_ROUTER_IP: &str = "10.78.0.254";
/// The port `httpd` pods of [`web_pod`] listen on (each pod has its own network namespace).
pub const HTTPD_PORT: u16 = 8080;

/// How the boxes are wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// All three on one switch, one segment ([`SEGMENT`]).
    OneSwitch,
    /// Boxes a and b on [`SEGMENT`], box c on [`FAR_SEGMENT`]; the switch namespace routes
    /// between the two (it knows no pod range), and every box has a default route through
    /// it: two sites behind one router.
    ThirdBehindRouter,
}

/// What the three-box test needs beyond the pod tests' prerequisites: `nsenter`, `ip`, `nft`.
pub fn tools_present() -> bool {
    ["nsenter", "ip", "nft"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    })
}

/// One box: its namespace, server process and directories.
pub struct BoxNode {
    pub name: String,
    pub netns: String,
    pub ip: String,
    pub data: PathBuf,
    pub log: PathBuf,
    pub cgroup_root: String,
    child: Option<KilledOnDrop>,
}

impl BoxNode {
    /// The admin kubeconfig this box's server wrote.
    pub fn kubeconfig(&self) -> PathBuf {
        self.data.join("admin.kubeconfig")
    }

    /// The supervised containerd's socket.
    pub fn socket(&self) -> PathBuf {
        self.data.join("agent/run/containerd.sock")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The three boxes and their switch. See the module docs.
pub struct Boxes {
    pub boxes: Vec<BoxNode>,
    /// The switch's namespace.
    pub switch: String,
    namespaces: Vec<String>,
    pub home: PathBuf,
    pub root: tempfile::TempDir,
}

/// Runs `args`, which must succeed; returns stdout.
fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `f` on a thread that entered network namespace `ns`: its sockets and the processes
/// it starts live there.
pub fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(ns);
            f()
        })
        .join()
        .expect("namespace thread")
    })
}

/// Moves the calling thread into network namespace `ns`.
fn enter(ns: &str) {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    rustix::thread::move_into_link_name_space(
        file.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .expect("setns");
}

impl Boxes {
    /// Creates the switch and the boxes, starts the three servers and waits until the three
    /// Nodes are Ready with a podCIDR and the busybox image is on every box.
    pub fn start() -> Boxes {
        Boxes::start_with(Layout::OneSwitch)
    }

    /// [`Boxes::start`] wired as `layout` says.
    pub fn start_with(layout: Layout) -> Boxes {
        let root = tempfile::Builder::new()
            .prefix("skbox")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let home = root.path().join("home");
        std::fs::create_dir_all(&home).expect("home");
        let prefix = format!(
            "skb{}x{}",
            std::process::id() % 100_000,
            rand::random::<u32>() % 100_000
        );
        let mut me = Boxes {
            boxes: Vec::new(),
            switch: format!("{prefix}-sw"),
            namespaces: Vec::new(),
            home,
            root,
        };
        me.add_ns(&me.switch.clone());
        let sw = me.switch.clone();
        sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"]);
        sh(&[
            "ip",
            "-n",
            &sw,
            "addr",
            "add",
            &format!("{OUTSIDE_IP}/{SEGMENT_PREFIX}"),
            "dev",
            "br0",
        ]);
        sh(&["ip", "-n", &sw, "link", "set", "br0", "up"]);
        if layout == Layout::ThirdBehindRouter {
            sh(&["ip", "-n", &sw, "link", "add", "br1", "type", "bridge"]);
            sh(&[
                "ip",
                "-n",
                &sw,
                "addr",
                "add",
                &format!("{FAR_ROUTER_IP}/{SEGMENT_PREFIX}"),
                "dev",
                "br1",
            ]);
            sh(&["ip", "-n", &sw, "link", "set", "br1", "up"]);
            sh(&[
                "ip",
                "netns",
                "exec",
                &sw,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ]);
        }
        for (i, name) in NAMES.iter().enumerate() {
            let ns = format!("{prefix}-{name}");
            me.add_ns(&ns);
            let port = format!("v{name}");
            sh(&[
                "ip", "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port,
                "netns", &sw,
            ]);
            let far = layout == Layout::ThirdBehindRouter && i == 2;
            let bridge = if far { "br1" } else { "br0" };
            sh(&[
                "ip", "-n", &sw, "link", "set", &port, "master", bridge, "up",
            ]);
            let ip = if far {
                FAR_BOX_IP.to_string()
            } else {
                box_ip(i)
            };
            sh(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{ip}/{SEGMENT_PREFIX}"),
                "dev",
                "eth0",
            ]);
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
            if layout == Layout::ThirdBehindRouter {
                let router = if far { FAR_ROUTER_IP } else { OUTSIDE_IP };
                sh(&["ip", "-n", &ns, "route", "add", "default", "via", router]);
            }
            me.boxes.push(BoxNode {
                name: name.to_string(),
                netns: ns,
                ip,
                data: me.root.path().join(name).join("data"),
                log: me.root.path().join(format!("{name}.log")),
                cgroup_root: format!("/{prefix}-{name}"),
                child: None,
            });
        }
        let initial = me
            .boxes
            .iter()
            .map(|b| format!("{}=http://{}:{PEER_PORT}", b.name, b.ip))
            .collect::<Vec<_>>()
            .join(",");
        // The boxes' resolver: the switch, where a test may answer DNS as the site's
        // resolver would (the host's own resolv.conf names servers the boxes cannot reach).
        std::fs::write(me.resolv_conf(), format!("nameserver {OUTSIDE_IP}\n"))
            .expect("resolv.conf");
        let pki = me.root.path().join("pki");
        // The first member creates the cluster's PKI; the others read it.
        me.launch(0, &initial, &pki);
        let deadline = Instant::now() + READY_TIMEOUT;
        while !pki.join("ca.crt").exists() {
            assert!(
                Instant::now() < deadline,
                "no PKI created\n{}",
                tail(&me.boxes[0].log_text())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        me.launch(1, &initial, &pki);
        me.launch(2, &initial, &pki);
        for i in 0..NAMES.len() {
            me.wait_node(i);
        }
        let archive = me.root.path().join("busybox.tar");
        build::busybox_image(Path::new(build::BUSYBOX), IMAGE)
            .expect("image")
            .write_oci_archive(&archive)
            .expect("write image");
        for b in &me.boxes {
            let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
                .args(["images", "import", "--data-dir"])
                .arg(&b.data)
                .arg(&archive)
                .output()
                .expect("skerry images import");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        me
    }

    fn add_ns(&mut self, ns: &str) {
        sh(&["ip", "netns", "add", ns]);
        self.namespaces.push(ns.to_string());
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
    }

    /// The resolv.conf every box's server is given (`--resolv-conf`): the switch's address.
    pub fn resolv_conf(&self) -> PathBuf {
        self.root.path().join("resolv.conf")
    }

    fn launch(&mut self, i: usize, initial: &str, pki: &Path) {
        let resolv_conf = self.resolv_conf();
        let b = &mut self.boxes[i];
        std::fs::create_dir_all(&b.data).expect("data dir");
        let peer = format!("http://{}:{PEER_PORT}", b.ip);
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", b.netns))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_skerry"))
            .args(["server", "--name", &b.name, "--data-dir"])
            .arg(&b.data)
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{CLIENT_PORT}"),
                "--initial-cluster",
                initial,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &API_PORT.to_string(),
                "--cluster-cidr",
                CLUSTER_CIDR,
                "--hostname-override",
                &b.name,
                "--node-ip",
                &b.ip,
                "--cgroup-root",
                &b.cgroup_root,
                "--kubelet-port",
                &KUBELET_PORT.to_string(),
                EVICTION_HARD,
                "--pki-dir",
            ])
            .arg(pki)
            .arg("--resolv-conf")
            .arg(&resolv_conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&b.log).expect("log file"))
            .spawn()
            .expect("start skerry in its box");
        b.child = Some(KilledOnDrop(child));
    }

    /// kubectl inside box `i`'s namespace against its own server.
    pub fn kubectl_output(&self, i: usize, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let b = &self.boxes[i];
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", b.netns))
            .arg("--")
            .arg(KUBECTL)
            .args(args)
            .env("KUBECONFIG", b.kubeconfig())
            .env("HOME", &self.home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(input.as_bytes())
                .expect("write stdin");
        }
        drop(child.stdin.take());
        child.wait_with_output().expect("kubectl output")
    }

    /// kubectl in box `i`, which must succeed; returns stdout.
    pub fn ok(&self, i: usize, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_output(i, args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?} in box {}: {}\n{}",
            NAMES[i],
            String::from_utf8_lossy(&out.stderr),
            tail(&self.boxes[i].log_text())
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until box `i`'s Node is Ready with a podCIDR (its network configured).
    fn wait_node(&self, i: usize) {
        let b = &self.boxes[i];
        let deadline = Instant::now() + READY_TIMEOUT + POD_TIMEOUT;
        loop {
            if b.kubeconfig().exists() {
                let out = self.kubectl_output(i, &["get", "node", &b.name, "-o", "json"], None);
                if out.status.success() {
                    let n: Value = serde_json::from_slice(&out.stdout).expect("node JSON");
                    let ready = n["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True");
                    if ready && n["spec"]["podCIDR"].is_string() {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "node {} never Ready with a podCIDR\n{}",
                b.name,
                tail(&b.log_text())
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The Nodes as box `i`'s server sees them.
    pub fn nodes(&self, i: usize) -> Vec<Value> {
        let out = self.ok(i, &["get", "nodes", "-o", "json"], None);
        let list: Value = serde_json::from_str(&out).expect("node list");
        list["items"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Boxes {
    fn drop(&mut self) {
        for b in &self.boxes {
            if let Some(child) = &b.child
                && let Some(pid) = rustix::process::Pid::from_raw(child.0.id() as i32)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for b in &mut self.boxes {
            if let Some(child) = &mut b.child {
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = child.0.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            // Killed (if still running) and reaped here.
            b.child = None;
            remove_leftovers(&b.socket(), &b.data, &b.cgroup_root);
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Waits until pod `name` (asked of box a) satisfies `ok`, `what` naming it for the failure.
pub fn wait_pod(boxes: &Boxes, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let out = boxes.kubectl_output(0, &["get", "pod", name, "-o", "json"], None);
        if out.status.success() {
            let pod: Value = serde_json::from_slice(&out.stdout).expect("pod JSON");
            if ok(&pod) {
                return pod;
            }
            assert!(
                Instant::now() < deadline,
                "pod {name} not {what}: {}\n{}",
                pod["status"],
                boxes
                    .boxes
                    .iter()
                    .map(|b| format!("--- {}\n{}", b.name, tail(&b.log_text())))
                    .collect::<String>()
            );
        }
        assert!(Instant::now() < deadline, "pod {name} not found");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An httpd pinned to `node` whose CGI `/cgi-bin/ip` answers the client's address.
pub fn web_pod(name: &str, node: &str) -> Value {
    let script = format!(
        "mkdir -p /tmp/w/cgi-bin && \
         printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\necho $REMOTE_ADDR\\n' > /tmp/w/cgi-bin/ip && \
         printf '#!/bin/sh\necho Content-Type: text/plain\necho\nhostname\n' > /tmp/w/cgi-bin/who && \
         chmod 755 /tmp/w/cgi-bin/ip /tmp/w/cgi-bin/who && exec httpd -f -p {HTTPD_PORT} -h /tmp/w"
    );
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "httpd", "image": IMAGE, "command": ["sh", "-c", script]}]}})
}

/// What the container `wget` of pod `name` on box a wrote, line by line. busybox httpd
/// listens on IPv6 and gives REMOTE_ADDR as `[::ffff:a.b.c.d]`: the IPv4 address is what
/// counts.
pub fn output_lines(boxes: &Boxes, name: &str, pod: &Value) -> Vec<String> {
    let log_path = boxes.boxes[0].data.join(format!(
        "agent/kubelet/pods-logs/default_{name}_{}/wget/0.log",
        pod["metadata"]["uid"].as_str().unwrap_or_default()
    ));
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    log.lines()
        .filter_map(|l| l.split_once(" stdout F ").map(|(_, text)| text))
        .map(|text| text.replace("[::ffff:", "").replace(']', ""))
        .collect()
}

/// A busybox pod `name` on box a running `script` (container `wget`, never restarted).
pub fn client_pod(name: &str, script: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": "a", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "wget", "image": IMAGE, "command": ["sh", "-c", script]}]}})
}

/// Runs [`client_pod`] `name` on box a to its end: the finished pod and its output lines.
pub fn run_on_a(boxes: &Boxes, name: &str, script: &str) -> (Value, Vec<String>) {
    boxes.ok(
        0,
        &["apply", "-f", "-"],
        Some(&client_pod(name, script).to_string()),
    );
    let pod = wait_pod(boxes, name, "finished", |p| {
        p["status"]["phase"] == "Succeeded" || p["status"]["phase"] == "Failed"
    });
    let lines = output_lines(boxes, name, &pod);
    (pod, lines)
}

impl Boxes {
    /// Box `i`'s main routing table as `ip route` prints it.
    pub fn routes(&self, i: usize) -> String {
        in_ns(&self.boxes[i].netns, || {
            Command::new("ip")
                .arg("route")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        })
    }
}
