//! `kubectl exec`, `exec -i`, `cp`, `port-forward` and `attach` for real: the real kubectl
//! (1.32, WebSocket first) against `skerry server`, whose apiserver proxies the upgrade to
//! the node's kubelet, which bridges it to containerd's SPDY streaming server (real
//! containerd, the busybox image built by the test, host-network pods as in `pods.rs`).
//! Then who may not: a user with `get` but not `create` on `pods/exec`.
//! The node harness is `common::node`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::http_get;
use common::kube::tail;
use common::node::{IMAGE, Node, missing_prerequisite, running};
use serde_json::Value;

const NODE: &str = "exec-node";

/// How long one streaming kubectl may take: a hang (stdin EOF lost, a stream never closed)
/// fails the test instead of stalling it.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a spawned `port-forward` or `attach` gets to show its first line.
const FIRST_LINE_TIMEOUT: Duration = Duration::from_secs(30);

impl Node {
    /// Applies a host-network pod running `script`.
    fn apply_shell_pod(&self, name: &str, script: &str) {
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": name, "image": IMAGE,
                                     "command": ["sh", "-c", script]}]}});
        self.kube
            .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    }

    /// Runs kubectl with `stdin` (then EOF) and returns its output; fails the test if it has
    /// not ended within [`KUBECTL_TIMEOUT`].
    fn kubectl_timed(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = self
            .kube
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        let mut input = child.stdin.take().expect("stdin");
        let data = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = reader(child.stdout.take().expect("stdout"));
        let err = reader(child.stderr.take().expect("stderr"));
        let deadline = Instant::now() + KUBECTL_TIMEOUT;
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "kubectl {args:?} still running after {KUBECTL_TIMEOUT:?}\n{}",
                    tail(&self.kube.log())
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = writer.join();
        Output {
            status,
            stdout: out.join().expect("stdout reader"),
            stderr: err.join().expect("stderr reader"),
        }
    }
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// The lines a spawned kubectl prints on stdout, as they come.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn kubectl_exec_cp_port_forward_and_attach_reach_the_container() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    node.apply_shell_pod("shell", "exec sleep 3600");
    let web_port = free_port();
    node.apply_shell_pod(
        "web",
        &format!(
            "mkdir -p /tmp/www && echo hello from web > /tmp/www/index.html && \
             exec httpd -f -p 127.0.0.1:{web_port} -h /tmp/www"
        ),
    );
    node.apply_shell_pod(
        "ticker",
        "i=0; while true; do i=$((i+1)); echo tick $i; sleep 1; done",
    );
    node.wait_pod("shell", "Running", running);

    // stdout and stderr apart, and the exit code: kubectl says it and exits with it.
    let out = node.kubectl_timed(
        &[
            "exec",
            "shell",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
        b"",
    );
    assert_eq!(text(&out.stdout), "out\n", "stderr: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("err\n"), "{stderr}");
    assert!(
        stderr.contains("command terminated with exit code 3"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(3));
    let started = Instant::now();
    let ok = node.kubectl_timed(&["exec", "shell", "--", "echo", "fine"], b"");
    eprintln!("kubectl exec echo: {:?}", started.elapsed());
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert_eq!(text(&ok.stdout), "fine\n");

    // stdin, and its end: `cat` sees EOF and exits, so kubectl returns.
    let out = node.kubectl_timed(&["exec", "-i", "shell", "--", "cat"], b"hi\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let out = node.kubectl_timed(&["exec", "-i", "shell", "--", "wc", "-c"], &big);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "300000");

    // kubectl cp both ways (tar over exec with stdin).
    let local = node.kube.path("payload.bin");
    std::fs::write(&local, &big).expect("write payload");
    let local_arg = local.display().to_string();
    let started = Instant::now();
    let out = node.kubectl_timed(&["cp", &local_arg, "shell:/tmp/payload.bin"], b"");
    eprintln!("kubectl cp of 300 kB into the pod: {:?}", started.elapsed());
    assert!(out.status.success(), "kubectl cp to: {}", text(&out.stderr));
    let out = node.kubectl_timed(
        &["exec", "shell", "--", "wc", "-c", "/tmp/payload.bin"],
        b"",
    );
    assert_eq!(text(&out.stdout).trim(), "300000 /tmp/payload.bin");
    let back = node.kube.path("back.bin");
    let back_arg = back.display().to_string();
    let out = node.kubectl_timed(&["cp", "shell:/tmp/payload.bin", &back_arg], b"");
    assert!(
        out.status.success(),
        "kubectl cp from: {}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&back).expect("copied back"), big);

    // A container that is not the pod's: the apiserver's 400.
    let stderr = text(
        &node
            .kubectl_timed(&["exec", "shell", "-c", "nope", "--", "true"], b"")
            .stderr,
    );
    assert!(
        stderr.contains("container nope is not valid for pod shell"),
        "{stderr}"
    );

    // A pod not yet bound to a node has nowhere to exec (the apiserver's 400).
    let pending = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nowhere"},
        "spec": {"nodeSelector": {"no-such": "node"},
                 "containers": [{"name": "c", "image": IMAGE}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&pending.to_string()));
    let stderr = text(
        &node
            .kubectl_timed(&["exec", "nowhere", "--", "true"], b"")
            .stderr,
    );
    assert!(
        stderr.contains("pod nowhere does not have a host assigned"),
        "{stderr}"
    );

    // port-forward: a request through it reaches the pod's server.
    node.wait_pod("web", "Running", running);
    let local_port = free_port();
    let mut forward = node
        .kube
        .command(&[
            "port-forward",
            "pod/web",
            &format!("{local_port}:{web_port}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl port-forward");
    let lines = lines_of(&mut forward);
    let first = lines.recv_timeout(FIRST_LINE_TIMEOUT);
    let mut answers = Vec::new();
    for _ in 0..2 {
        answers.push(http_get(
            local_port,
            "/index.html",
            FIRST_LINE_TIMEOUT,
            KUBECTL_TIMEOUT,
        ));
    }
    let _ = forward.kill();
    let _ = forward.wait();
    let first = first.expect("port-forward says it forwards");
    assert!(first.contains("Forwarding from 127.0.0.1"), "{first}");
    for a in answers {
        let a = a.unwrap_or_else(|e| {
            panic!("GET through port-forward: {e}\n{}", tail(&node.kube.log()))
        });
        assert!(a.starts_with("HTTP/1.") && a.contains(" 200 "), "{a}");
        assert!(a.ends_with("hello from web\n"), "{a}");
    }

    // attach: the running container's own output.
    node.wait_pod("ticker", "Running", running);
    let mut attach = node
        .kube
        .command(&["attach", "ticker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl attach");
    let lines = lines_of(&mut attach);
    let got: Vec<String> = (0..2)
        .filter_map(|_| lines.recv_timeout(FIRST_LINE_TIMEOUT).ok())
        .collect();
    let _ = attach.kill();
    let _ = attach.wait();
    assert_eq!(got.len(), 2, "two ticks through attach: {got:?}");
    for l in &got {
        assert!(l.starts_with("tick "), "{l}");
    }

    // get but not create on pods/exec: 403 (the WebSocket's GET is authorized as create).
    let role = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "exec-get", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["get"]}]});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&role.to_string()));
    node.kube.ok(&[
        "create",
        "rolebinding",
        "exec-get",
        "--role=exec-get",
        "--user=jane",
    ]);
    let out = node.kubectl_timed(&["exec", "--as=jane", "shell", "--", "true"], b"");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("forbidden") && stderr.contains("cannot create resource \"pods/exec\""),
        "{stderr}"
    );
    let role: Value = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "exec-get", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/exec"],
                   "verbs": ["get", "create"]}]});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&role.to_string()));
    let deadline = Instant::now() + KUBECTL_TIMEOUT;
    loop {
        let out = node.kubectl_timed(&["exec", "--as=jane", "shell", "--", "echo", "jane"], b"");
        if out.status.success() {
            assert_eq!(text(&out.stdout), "jane\n");
            break;
        }
        assert!(Instant::now() < deadline, "{}", text(&out.stderr));
        std::thread::sleep(Duration::from_millis(200));
    }
}
