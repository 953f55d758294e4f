//! Streaming for the clients that are not kubectl's WebSocket default, for real: kubectl
//! over SPDY (`KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`, `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`:
//! exec with stdin, stdout and the exit code, `cp`, `port-forward`), which the apiserver and
//! the kubelet pass through to containerd's streaming server; Debian's Python client
//! (`kubernetes.stream.stream` exec over `v4.channel.k8s.io`, `kubernetes.stream.portforward`
//! over the WebSocket channel protocol); `--streaming-connection-idle-timeout` closing an
//! idle session (SPDY and WebSocket) but not an active one; `kubectl exec -it` into a shell
//! on a real pty driven by Python (the prompt, a command, `stty size` following a resize,
//! the exit code), over WebSocket and over SPDY.
//! The node harness is `common::node`; the server runs with an idle timeout of
//! [`IDLE_TIMEOUT`].

mod common;

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::http_get;
use common::kube::tail;
use common::node::{IMAGE, Node, missing_prerequisite, running};
use serde_json::Value;

const NODE: &str = "spdy-node";

/// The interpreter whose `kubernetes` package is Debian's python3-kubernetes.
const PYTHON: &str = "/usr/bin/python3";

/// `--streaming-connection-idle-timeout` of the test's server: below the 5 s at which
/// kubectl (client-go) pings a SPDY or WebSocket session (a ping is traffic, as for
/// spdystream), and long enough that the interactive steps (each a round trip on
/// loopback) never come near.
const IDLE_TIMEOUT: Duration = Duration::from_secs(3);

/// How late after the idle timeout a silent session may be closed (the check runs on a
/// loaded box, and closing is noticed by the client's next read).
const IDLE_SLACK: Duration = Duration::from_secs(10);

/// How long one streaming client may take: a hang fails the test instead of stalling it.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// kubectl over SPDY for remote commands and port-forward.
const SPDY_ENV: [(&str, &str); 2] = [
    ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false"),
    ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false"),
];

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Runs `command` with `stdin` written (then EOF unless `hold_stdin`), and returns its
/// output and how long it ran; fails the test after [`CLIENT_TIMEOUT`].
fn run_timed(
    node: &Node,
    mut command: Command,
    stdin: &[u8],
    hold_stdin: bool,
) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
        if hold_stdin {
            // Kept open (and silent) until the process ends.
            std::thread::sleep(CLIENT_TIMEOUT);
        }
    });
    let out = reader(child.stdout.take().expect("stdout"));
    let err = reader(child.stderr.take().expect("stderr"));
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if started.elapsed() > CLIENT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} still running after {CLIENT_TIMEOUT:?}\n{}",
                tail(&node.kube.log())
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = started.elapsed();
    if !hold_stdin {
        let _ = writer.join();
    }
    (
        Output {
            status,
            stdout: out.join().expect("stdout reader"),
            stderr: err.join().expect("stderr reader"),
        },
        elapsed,
    )
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// kubectl over SPDY.
fn spdy_kubectl(node: &Node, args: &[&str]) -> Command {
    let mut c = node.kube.command(args);
    c.envs(SPDY_ENV);
    c
}

impl Node {
    fn apply_shell_pod(&self, name: &str, script: &str) {
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": name, "image": IMAGE,
                                     "command": ["sh", "-c", script]}]}});
        self.kube
            .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    }

    /// Runs a Python script with the admin kubeconfig and `args`; it must print JSON.
    fn python(&self, script: &str, args: &[&str]) -> Value {
        let path = self
            .kube
            .path(&format!("script-{}.py", rand::random::<u32>()));
        std::fs::write(&path, script).expect("write the script");
        let mut c = Command::new(PYTHON);
        c.arg(&path)
            .arg(&self.kube.kubeconfig)
            .args(args)
            .env("HOME", &self.kube.home);
        let (out, _) = run_timed(self, c, b"", false);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "python failed:\nstdout: {stdout}\nstderr: {}\nserver log tail:\n{}",
            text(&out.stderr),
            tail(&self.kube.log())
        );
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
    }
}

/// The Python client: exec (output; stdin and the exit code), port-forward, and a silent
/// exec session left open. Arguments: the kubeconfig, the web pod's port.
const PYTHON_STREAMS: &str = r#"
import json, sys, time
from kubernetes import client, config
from kubernetes.stream import stream, portforward
config.load_kube_config(config_file=sys.argv[1])
port = int(sys.argv[2])
v1 = client.CoreV1Api()
out = {}
out["echo"] = stream(v1.connect_get_namespaced_pod_exec, "shell", "default",
                     command=["sh", "-c", "echo hello from python"],
                     stderr=True, stdin=False, stdout=True, tty=False)
r = stream(v1.connect_get_namespaced_pod_exec, "shell", "default",
           command=["sh", "-c", "read l; echo got $l; echo bad >&2; exit 5"],
           stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
r.write_stdin("ping\n")
r.run_forever(timeout=30)
out["stdout"] = r.read_stdout()
out["stderr"] = r.read_stderr()
out["code"] = r.returncode
pf = portforward(v1.connect_get_namespaced_pod_portforward, "web", "default", ports=str(port))
s = pf.socket(port)
s.setblocking(True)
s.sendall(b"GET /index.html HTTP/1.0\r\nHost: web\r\n\r\n")
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
s.close()
out["forwarded"] = data.decode()
out["forward_error"] = pf.error(port)
# A session nobody writes to: the kubelet closes it after the idle timeout.
r = stream(v1.connect_get_namespaced_pod_exec, "shell", "default", command=["cat"],
           stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
t = time.time()
while r.is_open() and time.time() - t < 60:
    r.update(timeout=1)
out["idle_closed_after"] = time.time() - t
out["idle_still_open"] = r.is_open()
print(json.dumps(out))
"#;

/// Runs the command after the kubeconfig argument (`kubectl exec -it ... -- sh`) on a pty
/// of 30x100 and talks to the shell: the prompt, `stty size`, a resize to 40x120 and
/// `stty size` again, arithmetic, `exit 7`. Prints the sizes seen, the exit code and the
/// transcript.
const PYTHON_PTY: &str = r##"
import fcntl, json, os, pty, select, struct, sys, termios, time
argv = sys.argv[2:]
def setsize(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
pid, fd = pty.fork()
if pid == 0:
    setsize(0, 30, 100)
    os.execv(argv[0], argv)
buf = b""
def expect(pattern, timeout=30, since=0):
    global buf
    deadline = time.time() + timeout
    while pattern not in buf[since:]:
        left = deadline - time.time()
        if left <= 0:
            return False
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return False
            if not chunk:
                return False
            buf += chunk
    return True
out = {"prompt": expect(b"# ")}
mark = len(buf)
os.write(fd, b"stty size\r")
out["size"] = expect(b"30 100", since=mark)
setsize(fd, 40, 120)
resized = False
for _ in range(20):
    mark = len(buf)
    os.write(fd, b"stty size\r")
    if expect(b"40 120", timeout=1, since=mark):
        resized = True
        break
out["resized"] = resized
mark = len(buf)
os.write(fd, b"echo $((6*7))\r")
out["answer"] = expect(b"\n42", since=mark)
os.write(fd, b"exit 7\r")
expect(b"never", timeout=10)
_, status = os.waitpid(pid, 0)
out["code"] = os.waitstatus_to_exitcode(status)
out["transcript"] = buf.decode("utf-8", "replace")
print(json.dumps(out))
"##;

#[test]
fn spdy_python_idle_timeout_and_a_terminal() {
    if missing_prerequisite() {
        return;
    }
    let idle = format!("{}s", IDLE_TIMEOUT.as_secs());
    let node = Node::start_with(NODE, &["--streaming-connection-idle-timeout", &idle]);
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
    node.wait_pod("shell", "Running", running);

    // SPDY exec: stdout and stderr apart, the exit code; stdin and its end.
    let (out, _) = run_timed(
        &node,
        spdy_kubectl(
            &node,
            &[
                "exec",
                "shell",
                "--",
                "sh",
                "-c",
                "echo out; echo err >&2; exit 3",
            ],
        ),
        b"",
        false,
    );
    assert_eq!(text(&out.stdout), "out\n", "stderr: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("err\n"), "{stderr}");
    assert!(
        stderr.contains("command terminated with exit code 3"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(3));
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let started = Instant::now();
    let (out, _) = run_timed(
        &node,
        spdy_kubectl(&node, &["exec", "-i", "shell", "--", "wc", "-c"]),
        &big,
        false,
    );
    eprintln!("SPDY exec -i of 300 kB: {:?}", started.elapsed());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "300000");

    // SPDY kubectl cp both ways.
    let local = node.kube.path("payload.bin");
    std::fs::write(&local, &big).expect("write payload");
    let local_arg = local.display().to_string();
    let (out, _) = run_timed(
        &node,
        spdy_kubectl(&node, &["cp", &local_arg, "shell:/tmp/payload.bin"]),
        b"",
        false,
    );
    assert!(out.status.success(), "kubectl cp to: {}", text(&out.stderr));
    let back = node.kube.path("back.bin");
    let back_arg = back.display().to_string();
    let (out, _) = run_timed(
        &node,
        spdy_kubectl(&node, &["cp", "shell:/tmp/payload.bin", &back_arg]),
        b"",
        false,
    );
    assert!(
        out.status.success(),
        "kubectl cp from: {}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&back).expect("copied back"), big);

    // SPDY port-forward: two requests through one forward.
    node.wait_pod("web", "Running", running);
    let local_port = free_port();
    let mut forward = spdy_kubectl(
        &node,
        &[
            "port-forward",
            "pod/web",
            &format!("{local_port}:{web_port}"),
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("kubectl port-forward");
    let answers: Vec<_> = (0..2)
        .map(|_| http_get(local_port, "/index.html", CLIENT_TIMEOUT, CLIENT_TIMEOUT))
        .collect();
    let _ = forward.kill();
    let _ = forward.wait();
    for a in answers {
        let a = a.unwrap_or_else(|e| {
            panic!(
                "GET through SPDY port-forward: {e}\n{}",
                tail(&node.kube.log())
            )
        });
        assert!(a.starts_with("HTTP/1.") && a.contains(" 200 "), "{a}");
        assert!(a.ends_with("hello from web\n"), "{a}");
    }

    // The Python client: v4 exec and WebSocket port-forward; its silent session is closed.
    let py = node.python(PYTHON_STREAMS, &[&web_port.to_string()]);
    assert_eq!(py["echo"], "hello from python\n", "{py}");
    assert_eq!(py["stdout"], "got ping\n", "{py}");
    assert_eq!(py["stderr"], "bad\n", "{py}");
    assert_eq!(py["code"], 5, "{py}");
    let forwarded = py["forwarded"].as_str().unwrap_or_default();
    assert!(
        forwarded.starts_with("HTTP/1.") && forwarded.contains(" 200 "),
        "{py}"
    );
    assert!(forwarded.ends_with("hello from web\n"), "{py}");
    assert_eq!(py["forward_error"], Value::Null, "{py}");
    assert_eq!(py["idle_still_open"], false, "{py}");
    let closed_after = py["idle_closed_after"].as_f64().unwrap_or_default();
    eprintln!("silent WebSocket session closed after {closed_after:.1} s");
    assert!(
        closed_after >= IDLE_TIMEOUT.as_secs_f64() - 0.5
            && closed_after < (IDLE_TIMEOUT + IDLE_SLACK).as_secs_f64(),
        "{py}"
    );

    // Idle timeout over SPDY: a silent `exec -i cat` is closed; a session that prints every
    // second for longer than the timeout is not.
    let (out, elapsed) = run_timed(
        &node,
        spdy_kubectl(&node, &["exec", "-i", "shell", "--", "cat"]),
        b"",
        true,
    );
    eprintln!(
        "silent SPDY session ended after {elapsed:?}: {}",
        text(&out.stderr).trim()
    );
    assert!(
        elapsed >= IDLE_TIMEOUT && elapsed < IDLE_TIMEOUT + IDLE_SLACK,
        "{elapsed:?}"
    );
    let script = "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i; sleep 1; done";
    for spdy in [true, false] {
        let mut c = node
            .kube
            .command(&["exec", "shell", "--", "sh", "-c", script]);
        if spdy {
            c.envs(SPDY_ENV);
        }
        let (out, elapsed) = run_timed(&node, c, b"", false);
        assert!(out.status.success(), "spdy {spdy}: {}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n",
            "spdy {spdy}"
        );
        assert!(elapsed > IDLE_TIMEOUT, "{elapsed:?}");
    }

    // exec -it into a shell on a real terminal, over WebSocket (kubectl's default) and SPDY.
    for spdy in [false, true] {
        let pty_script = node.kube.path("terminal.py");
        std::fs::write(&pty_script, PYTHON_PTY).expect("write the pty script");
        let mut c = Command::new(PYTHON);
        c.arg(&pty_script)
            .arg(&node.kube.kubeconfig)
            .args(["/usr/bin/kubectl", "exec", "-it", "shell", "--", "sh"])
            .env("KUBECONFIG", &node.kube.kubeconfig)
            .env("HOME", &node.kube.home);
        if spdy {
            c.envs(SPDY_ENV);
        }
        let (out, _) = run_timed(&node, c, b"", false);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let r: Value = serde_json::from_str(text(&out.stdout).trim())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)));
        for step in ["prompt", "size", "resized", "answer"] {
            assert_eq!(r[step], true, "spdy {spdy}: {step}: {}", r["transcript"]);
        }
        assert_eq!(r["code"], 7, "spdy {spdy}: {}", r["transcript"]);
    }
}
