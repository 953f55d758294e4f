//! The pod checkpoint against a real agent and containerd (`node/src/checkpoint/pods.rs`,
//! `node/src/kubelet/mod.rs`): `skerry agent` reaches a control-plane-only server through a
//! TCP proxy this test controls. Its pods are checkpointed; the agent stops and its containers
//! die (their shims and cgroups are killed, as a reboot would); a pod is force-deleted while
//! the proxy refuses the agent; the agent restarts without its API and runs the pods of its
//! checkpoint (a corrupted file is logged and skipped); the proxy comes back and the API's
//! list replaces the checkpoint: the force-deleted pod is removed from the runtime, the other
//! keeps its container and is Running in the API, the skipped one runs. A pod deleted normally,
//! or one that completed, leaves no checkpoint.

mod common;

use std::io::Read as _;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::free_port;
use common::kube::{KilledOnDrop, Kube, tail};
use common::node::{IMAGE, POD_TIMEOUT, cri_containers, missing_prerequisite};
use serde_json::Value;
use skerry_node::cri::api;
use skerry_node::images::build;
use skerry_node::testing::remove_leftovers;

const NODE: &str = "ckpt-1";
/// How long the agent gets to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a restarted agent without its API gets to run the checkpointed pods again: the
/// kubelet's `API_SOURCE_WAIT` (5 s), then a sandbox and a container per pod on a loaded box.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(60);

/// A TCP forwarder to the apiserver, one thread per direction of each connection. While down
/// it accepts and closes at once (the agent sees its connections fail), and taking it down
/// closes the connections it carries.
struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let up = Arc::new(AtomicBool::new(true));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (up2, conns2) = (up.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !up2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let mut kept = conns2.lock().unwrap_or_else(|p| p.into_inner());
                for s in [&client, &server] {
                    if let Ok(c) = s.try_clone() {
                        kept.push(c);
                    }
                }
                drop(kept);
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Write);
                    });
                }
            }
        });
        Proxy { port, up, conns }
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
        if !up {
            for c in self
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain(..)
            {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }
}

/// A running `skerry agent` (SIGTERM on drop).
struct Agent {
    child: KilledOnDrop,
    log: PathBuf,
}

impl Agent {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.0.try_wait() {
            panic!("skerry agent exited ({status}):\n{}", tail(&self.log()));
        }
    }

    /// SIGTERM, then waits for the exit.
    fn stop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let _ = std::fs::copy(
                &self.log,
                std::env::temp_dir().join(format!(
                    "pods_checkpoint-{}-{}",
                    std::process::id(),
                    self.log
                        .file_name()
                        .and_then(|n| n.to_str())
                        .unwrap_or_default()
                )),
            );
        }
    }
}

/// What the agent runs with; removes the runtime's leftovers on drop.
struct Box_ {
    dir: tempfile::TempDir,
    cgroup_root: String,
    args: Vec<String>,
}

impl Box_ {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn socket(&self) -> PathBuf {
        self.data().join("agent/run/containerd.sock")
    }

    fn checkpoint(&self, uid: &str) -> PathBuf {
        self.data()
            .join("agent/kubelet")
            .join(skerry_node::checkpoint::pods::POD_CHECKPOINT_DIR)
            .join(skerry_node::checkpoint::pods::key(uid))
    }

    /// Starts the agent; its log goes to `agent-<n>.log`.
    fn start(&self, n: u32) -> Agent {
        let log = self.dir.path().join(format!("agent-{n}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_skerry"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start skerry agent");
        Agent {
            child: KilledOnDrop(child),
            log,
        }
    }

    /// What a reboot does to the pods: every shim and pod process killed, the mounts and
    /// cgroups gone (containerd's records stay, as on disk).
    fn kill_pods(&self) {
        remove_leftovers(&self.socket(), self.dir.path(), &self.cgroup_root);
    }
}

impl Drop for Box_ {
    fn drop(&mut self) {
        self.kill_pods();
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// The containers of the pod `uid`; none while containerd is not up yet.
fn containers(socket: &Path, uid: &str) -> Vec<api::Container> {
    if !socket.exists() {
        return Vec::new();
    }
    block_on(async {
        let Ok(cri) = skerry_node::cri::Cri::new(&socket.display().to_string()) else {
            return Vec::new();
        };
        cri.list_containers(Some(api::ContainerFilter {
            label_selector: [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into(),
            ..Default::default()
        }))
        .await
        .unwrap_or_default()
    })
}

/// The IDs of the running containers of the pod `uid`.
fn running_containers(socket: &Path, uid: &str) -> Vec<String> {
    containers(socket, uid)
        .into_iter()
        .filter(|c| c.state == api::ContainerState::ContainerRunning as i32)
        .map(|c| c.id)
        .collect()
}

/// The sandboxes of the pod `uid`, in any state.
fn sandboxes(socket: &Path, uid: &str) -> Vec<api::PodSandbox> {
    block_on(async {
        let cri = skerry_node::cri::Cri::new(&socket.display().to_string()).expect("endpoint");
        cri.list_pod_sandbox(Some(api::PodSandboxFilter {
            label_selector: [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into(),
            ..Default::default()
        }))
        .await
        .expect("ListPodSandbox")
    })
}

/// A pod bound to the node running `sleep`, with no token volume (a token cannot be had
/// without the API) and the host's network.
fn sleep_pod(name: &str, seconds: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["sleep", seconds]}]
        }
    })
    .to_string()
}

fn pod(kube: &Kube, name: &str) -> Value {
    serde_json::from_str(&kube.ok(&["get", "pod", name, "-o", "json"])).expect("pod JSON")
}

/// Polls `f` until it returns `Some`, at most `timeout`; panics with `what` and the agent's log.
fn wait<T>(
    agent: &mut Agent,
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        agent.assert_alive();
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {timeout:?}\nagent:\n{}",
            tail(&agent.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The container ID the API's status shows running for the pod (without the `containerd://`).
fn api_running_container(p: &Value) -> Option<String> {
    if p["status"]["phase"] != "Running" {
        return None;
    }
    let c = &p["status"]["containerStatuses"][0];
    c["state"]["running"].is_object().then_some(())?;
    c["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("containerd://"))
        .map(str::to_string)
}

#[test]
fn checkpointed_pods_run_without_the_api_and_the_api_replaces_them() {
    if missing_prerequisite() {
        return;
    }
    let kube = Kube::start(&[]);
    let server = common::api_url(&kube);
    let target: SocketAddr = server
        .strip_prefix("https://")
        .and_then(|a| a.parse().ok())
        .expect("an https://IP:port server");
    let proxy = Proxy::start(target);
    let via_proxy = format!("https://127.0.0.1:{}", proxy.port);
    let ip = common::host_ip();
    let creds = kube.dir.path().join("agent-creds");
    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(["node-credentials", "--data-dir"])
        .arg(kube.dir.path().join("data"))
        .args(["--node", NODE, "--ip", &ip, "--server", &via_proxy])
        .arg("--out")
        .arg(&creds)
        .output()
        .expect("skerry node-credentials");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile::Builder::new()
        .prefix("skc")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let cgroup_root = format!(
        "/skerry-test-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    );
    let file = |name: &str| creds.join(name).display().to_string();
    let args = vec![
        "agent".to_string(),
        "--server".into(),
        via_proxy.clone(),
        "--kubeconfig".into(),
        file("kubelet.kubeconfig"),
        "--tls-cert-file".into(),
        file("kubelet.crt"),
        "--tls-private-key-file".into(),
        file("kubelet.key"),
        "--data-dir".into(),
        dir.path().join("data").display().to_string(),
        "--hostname-override".into(),
        NODE.into(),
        "--node-ip".into(),
        ip.clone(),
        "--cgroup-root".into(),
        cgroup_root.clone(),
        "--kubelet-port".into(),
        free_port().to_string(),
        // Beside other tests' servers in the host's network namespace (see common/kube.rs).
        "--disable-network".into(),
        "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%".into(),
    ];
    let host = Box_ {
        dir,
        cgroup_root,
        args,
    };
    let socket = host.socket();

    // 1. Through the proxy: the Node registers, pods a, b and c run, each checkpointed.
    let mut agent = host.start(1);
    wait(&mut agent, POD_TIMEOUT, "the Node registered", || {
        kube.kubectl_output(&["get", "node", NODE], None)
            .status
            .success()
            .then_some(())
    });
    let archive = host.dir.path().join("busybox.tar");
    build::busybox_image(Path::new(build::BUSYBOX), IMAGE)
        .expect("image")
        .write_oci_archive(&archive)
        .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(["images", "import", "--data-dir"])
        .arg(host.data())
        .arg(&archive)
        .output()
        .expect("skerry images import");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, seconds) in [("a", "3600"), ("b", "3600"), ("c", "3607")] {
        kube.ok_in(&["apply", "-f", "-"], Some(&sleep_pod(name, seconds)));
    }
    let mut uids = std::collections::HashMap::new();
    let mut first = std::collections::HashMap::new();
    for name in ["a", "b", "c"] {
        let id = wait(
            &mut agent,
            POD_TIMEOUT,
            &format!("pod {name} Running"),
            || api_running_container(&pod(&kube, name)),
        );
        let uid = pod(&kube, name)["metadata"]["uid"]
            .as_str()
            .expect("uid")
            .to_string();
        assert!(
            host.checkpoint(&uid).exists(),
            "no checkpoint of pod {name} at {}",
            host.checkpoint(&uid).display()
        );
        first.insert(name, id);
        uids.insert(name, uid);
    }

    // A pod that completes leaves no checkpoint: it would run again at a start without API.
    let done = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "d", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["true"]}]
        }
    });
    kube.ok_in(&["apply", "-f", "-"], Some(&done.to_string()));
    let d = wait(&mut agent, POD_TIMEOUT, "pod d Succeeded", || {
        let p = pod(&kube, "d");
        (p["status"]["phase"] == "Succeeded").then_some(p)
    });
    let d_uid = d["metadata"]["uid"].as_str().expect("uid").to_string();
    wait(
        &mut agent,
        POD_TIMEOUT,
        "pod d's checkpoint removed",
        || (!host.checkpoint(&d_uid).exists()).then_some(()),
    );

    // 2. The agent stops and its pods die; the proxy goes down; b is force-deleted and c's
    // checkpoint gets one byte changed.
    agent.stop();
    host.kill_pods();
    proxy.set_up(false);
    kube.ok(&["delete", "pod", "b", "--grace-period=0", "--force"]);
    let c_file = host.checkpoint(&uids["c"]);
    let text = std::fs::read_to_string(&c_file).expect("c's checkpoint");
    assert_eq!(text.matches("\"3607\"").count(), 1, "{text}");
    let corrupted = text.replace("\"3607\"", "\"3608\"");
    std::fs::write(&c_file, &corrupted).expect("corrupt c's checkpoint");

    // 3. Restarted without the API: a and b run again from the checkpoint, c does not.
    let mut agent = host.start(2);
    let started = Instant::now();
    let restored: Vec<String> = ["a", "b"]
        .iter()
        .map(|name| {
            let uid = &uids[name];
            wait(
                &mut agent,
                RESTORE_TIMEOUT,
                &format!("pod {name} running again from the checkpoint"),
                || {
                    running_containers(&socket, uid)
                        .into_iter()
                        .find(|id| *id != first[name])
                },
            )
        })
        .collect();
    eprintln!(
        "checkpointed pods running again {:?} after the agent's start",
        started.elapsed()
    );
    let log = agent.log();
    assert!(
        log.contains("running the checkpointed pods"),
        "{}",
        tail(&log)
    );
    assert!(
        log.contains("ignoring a pod checkpoint") && log.contains(&uids["c"]),
        "the corrupt checkpoint is logged: {}",
        tail(&log)
    );
    assert!(
        cri_containers(&socket, &uids["c"])
            .iter()
            .all(|c| c.state != api::ContainerState::ContainerRunning as i32),
        "pod c's corrupt checkpoint was run"
    );

    // 4. The proxy comes back: b's sandbox and containers are removed, a keeps its container
    // and the API shows it Running with it; c runs from the API's list.
    proxy.set_up(true);
    wait(
        &mut agent,
        POD_TIMEOUT,
        "pod b removed from the runtime",
        || {
            (sandboxes(&socket, &uids["b"]).is_empty()
                && cri_containers(&socket, &uids["b"]).is_empty())
            .then_some(())
        },
    );
    assert!(
        !host.checkpoint(&uids["b"]).exists(),
        "b's checkpoint is left"
    );
    wait(&mut agent, POD_TIMEOUT, "pod a Running in the API", || {
        (api_running_container(&pod(&kube, "a")).as_deref() == Some(restored[0].as_str()))
            .then_some(())
    });
    assert_eq!(
        running_containers(&socket, &uids["a"]),
        vec![restored[0].clone()],
        "pod a kept its container"
    );
    wait(&mut agent, POD_TIMEOUT, "pod c Running", || {
        api_running_container(&pod(&kube, "c"))
    });
    let rewritten = std::fs::read_to_string(&c_file).expect("c's checkpoint");
    assert_ne!(rewritten, corrupted, "c's checkpoint is written again");

    // A pod deleted normally leaves no checkpoint.
    kube.ok(&["delete", "pod", "a", "--grace-period=1", "--wait=true"]);
    wait(
        &mut agent,
        POD_TIMEOUT,
        "pod a's checkpoint removed",
        || (!host.checkpoint(&uids["a"]).exists()).then_some(()),
    );
    let mut rest = String::new();
    let _ = std::fs::File::open(&c_file).and_then(|mut f| f.read_to_string(&mut rest));
    assert!(rest.contains(&uids["c"]), "c's checkpoint stays");
    drop(agent);
}
