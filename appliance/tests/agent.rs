//! `skerry agent`: a node agent alone, joined to a control plane that runs in another process
//! with `--disable-agent`, with the credentials `skerry node-credentials` issued from that
//! member's CA (upstream's `--kubeconfig`, `--tls-cert-file`, `--tls-private-key-file`). The
//! agent registers its Node (allowed by the Node authorizer alone: nobody binds a role for
//! it), runs a pod the scheduler puts on it with its own containerd, and `kubectl logs`
//! reaches its kubelet API, whose certificate the apiserver verifies against the cluster CA.
//! Then bad credentials: a missing file is a one-line error and a non-zero exit.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::free_port;
use common::kube::{KilledOnDrop, Kube, tail};
use common::node::{IMAGE, POD_TIMEOUT, missing_prerequisite, running};
use serde_json::Value;
use skerry_node::images::build;
use skerry_node::testing::remove_leftovers;

const NODE: &str = "agent-1";
/// How long the agent gets to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

struct Agent {
    child: KilledOnDrop,
    dir: tempfile::TempDir,
    cgroup_root: String,
}

impl Agent {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// Panics with the agent's log if it has exited.
    fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.0.try_wait() {
            panic!("skerry agent exited ({status}):\n{}", tail(&self.log()));
        }
    }

    fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("data/agent/run/containerd.sock")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        remove_leftovers(&self.socket(), self.dir.path(), &self.cgroup_root);
    }
}

fn skerry(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(args)
        .output()
        .expect("run skerry")
}

#[test]
fn an_agent_joins_a_control_plane_and_runs_its_pods() {
    if missing_prerequisite() {
        return;
    }
    let kube = Kube::start(&[]);
    let server = common::api_url(&kube);
    let ip = common::host_ip();
    let creds = kube.dir.path().join("agent-creds");
    let data = kube.dir.path().join("data");
    let out = skerry(&[
        "node-credentials",
        "--data-dir",
        &data.display().to_string(),
        "--node",
        NODE,
        "--ip",
        &ip,
        "--server",
        &server,
        "--out",
        &creds.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key_mode = std::fs::metadata(creds.join("kubelet.key"))
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("the key file");
    assert_eq!(key_mode, 0o600, "the serving key is private");
    // The network's own identity: kube-proxy's user, which reads every Node (the node's
    // identity reads only its own) and no Secret.
    let network_kubeconfig = creds.join("network.kubeconfig").display().to_string();
    let as_network = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", network_kubeconfig.as_str()];
        all.extend_from_slice(args);
        kube.kubectl_output(&all, None)
    };
    let whoami = as_network(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(String::from_utf8_lossy(&whoami.stdout), "system:kube-proxy");
    assert!(as_network(&["get", "nodes"]).status.success());
    let secrets = as_network(&["get", "secrets", "-A"]);
    assert!(
        !secrets.status.success() && String::from_utf8_lossy(&secrets.stderr).contains("forbidden"),
        "{secrets:?}"
    );

    let dir = tempfile::Builder::new()
        .prefix("ska")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let cgroup_root = format!(
        "/skerry-test-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    );
    let kubelet_port = free_port().to_string();
    let agent_args = [
        "agent",
        "--server",
        &server,
        "--kubeconfig",
        &creds.join("kubelet.kubeconfig").display().to_string(),
        "--tls-cert-file",
        &creds.join("kubelet.crt").display().to_string(),
        "--tls-private-key-file",
        &creds.join("kubelet.key").display().to_string(),
        "--data-dir",
        &dir.path().join("data").display().to_string(),
        "--hostname-override",
        NODE,
        "--node-ip",
        &ip,
        "--cgroup-root",
        &cgroup_root,
        "--kubelet-port",
        &kubelet_port,
        // Beside other tests' servers in the host's network namespace (see common/kube.rs).
        "--disable-network",
        "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%",
    ]
    .map(str::to_string);
    let child = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(&agent_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("agent.log")).expect("log"))
        .spawn()
        .expect("start skerry agent");
    let mut agent = Agent {
        child: KilledOnDrop(child),
        dir,
        cgroup_root,
    };

    // The Node registers (the Node authorizer lets it: no binding was made).
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        agent.assert_alive();
        let out = kube.kubectl_output(&["get", "node", NODE, "-o", "json"], None);
        if out.status.success() {
            let node: Value = serde_json::from_slice(&out.stdout).expect("node JSON");
            let ready = node["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "Node {NODE} not Ready\nagent:\n{}\nserver:\n{}",
            tail(&agent.log()),
            tail(&kube.log())
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let bindings = kube.ok(&["get", "clusterrolebindings", "-o", "name"]);
    assert!(
        !bindings.contains(&format!("skerry:node:{NODE}")),
        "the agent needs no binding: {bindings}"
    );

    // Its containerd takes an image, and a pod the scheduler places runs there.
    let archive = agent.dir.path().join("busybox.tar");
    build::busybox_image(Path::new(build::BUSYBOX), IMAGE)
        .expect("image")
        .write_oci_archive(&archive)
        .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(["images", "import", "--data-dir"])
        .arg(agent.dir.path().join("data"))
        .arg(&archive)
        .output()
        .expect("skerry images import");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "hostNetwork": true,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "echo hello from the agent; sleep 3600"]}]
        }
    });
    kube.ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let out = kube.kubectl_output(&["get", "pod", "hello", "-o", "json"], None);
        if out.status.success() {
            let p: Value = serde_json::from_slice(&out.stdout).expect("pod JSON");
            if running(&p) {
                assert_eq!(p["spec"]["nodeName"], NODE);
                assert_eq!(p["status"]["hostIP"], ip.as_str());
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "pod not Running\nagent:\n{}",
            tail(&agent.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // `kubectl logs` goes through the apiserver to the agent's kubelet API.
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let out = kube.kubectl_output(&["logs", "hello"], None);
        if String::from_utf8_lossy(&out.stdout).contains("hello from the agent") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kubectl logs: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            tail(&agent.log())
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    kube.ok(&["delete", "pod", "hello", "--grace-period=1", "--wait=true"]);
}

#[test]
fn bad_agent_flags_are_one_line_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nothing.kubeconfig");
    let out = skerry(&[
        "agent",
        "--server",
        "https://127.0.0.1:1",
        "--kubeconfig",
        &missing.display().to_string(),
        "--tls-cert-file",
        "/nonexistent.crt",
        "--tls-private-key-file",
        "/nonexistent.key",
        "--data-dir",
        &dir.path().join("data").display().to_string(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--network-kubeconfig") && stderr.contains("--disable-network"),
        "the network's identity is asked for first: {stderr}"
    );
    let out = skerry(&[
        "agent",
        "--server",
        "https://127.0.0.1:1",
        "--kubeconfig",
        &missing.display().to_string(),
        "--tls-cert-file",
        "/nonexistent.crt",
        "--tls-private-key-file",
        "/nonexistent.key",
        "--data-dir",
        &dir.path().join("data").display().to_string(),
        "--disable-network",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--kubeconfig") && stderr.contains("nothing.kubeconfig"),
        "{stderr}"
    );

    let out = skerry(&[
        "agent",
        "--server",
        "http://127.0.0.1:1",
        "--kubeconfig",
        "k",
        "--tls-cert-file",
        "c",
        "--tls-private-key-file",
        "k",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("an https:// URL"), "{stderr}");

    let out = skerry(&[
        "node-credentials",
        "--data-dir",
        &dir.path().display().to_string(),
        "--node",
        "x",
        "--ip",
        "10.0.0.1",
        "--out",
        &dir.path().join("out").display().to_string(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no cluster PKI"), "{stderr}");
}

#[test]
fn a_bad_node_flag_stops_the_server_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data").display().to_string();
    for (flag, value, said) in [
        ("--container-log-max-files", "1", "must be > 1"),
        ("--container-log-max-size", "junk", "invalid quantity"),
        (
            "--reserved-memory",
            "0:memory=junk",
            "failed to parse memory quantity",
        ),
        (
            "--resolv-conf",
            "/nonexistent/resolv.conf",
            "No such file or directory",
        ),
    ] {
        let out = skerry(&["server", "--data-dir", &data, flag, value]);
        assert!(!out.status.success(), "{flag} {value} was taken");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag) && stderr.contains(said), "{stderr}");
    }
}
