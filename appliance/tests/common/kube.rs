//! The real kubectl against running `skerry server`s: [`Kube`] is one server with its
//! Kubernetes API on a free port and its own `HOME` (so kubectl's discovery and HTTP caches
//! start empty); [`Cluster`] is three members sharing one PKI. Both kill their processes on
//! drop.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// The kubectl users run.
pub const KUBECTL: &str = "/usr/bin/kubectl";

/// How long a new server gets until `kubectl get --raw /readyz` succeeds: store open,
/// bootstrap objects written, watch caches loaded. Seconds on a debug build; the slack is for
/// a loaded 2-core machine running tests in parallel.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// `--eviction-hard` of the tests' node agents (see `launch`).
const EVICTION_HARD_FOR_TESTS: &str =
    "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%";

/// A `skerry server` with its Kubernetes API, killed on drop.
pub struct Kube {
    pub _child: KilledOnDrop,
    /// etcd's API of the same server (`http://127.0.0.1:PORT`), for looking under the API.
    pub etcd: String,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub home: PathBuf,
}

/// A child process, killed and reaped on drop, so a failing test leaves no server behind.
pub struct KilledOnDrop(pub Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Kube {
    /// A server with the control plane only (`--disable-agent`): these tests run many
    /// servers and kill them with SIGKILL, which a supervised containerd would outlive.
    pub fn start(extra: &[&str]) -> Kube {
        Kube::launch(extra, false, &[], |_| {})
    }

    /// A server that also runs its node agent (containerd and the kubelet): the caller stops
    /// it with SIGTERM so containerd stops with it. The kubelet's API gets a free port unless
    /// `extra` names one: tests run in parallel, and only one could have the default 10250.
    pub fn start_with_agent(extra: &[&str], env: &[(&str, &str)]) -> Kube {
        let port = free_port().to_string();
        let mut args = extra.to_vec();
        if !extra.contains(&"--kubelet-port") {
            args.extend(["--kubelet-port", &port]);
        }
        Kube::launch(&args, true, env, |_| {})
    }

    /// [`Kube::start_with_agent`] after `prepare` ran on the data dir (created, empty): a
    /// test mounts a small file system of its own there.
    pub fn start_with_agent_prepared(extra: &[&str], prepare: impl FnOnce(&Path)) -> Kube {
        let port = free_port().to_string();
        let mut args = extra.to_vec();
        if !extra.contains(&"--kubelet-port") {
            args.extend(["--kubelet-port", &port]);
        }
        Kube::launch(&args, true, &[], prepare)
    }

    fn launch(
        extra: &[&str],
        agent: bool,
        env: &[(&str, &str)],
        prepare: impl FnOnce(&Path),
    ) -> Kube {
        let dir = tempfile::Builder::new()
            .prefix("sk")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data dir");
        prepare(&data);
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).expect("home");
        let api_port = free_port();
        let etcd_port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_skerry"))
            .args([
                "server",
                "--data-dir",
                &data.display().to_string(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &api_port.to_string(),
            ])
            .args((!agent).then_some("--disable-agent"))
            // Tests run many servers in the host's one network namespace: their networks
            // would share one nftables table and port 53. The network is tested in
            // namespaces of its own (`common/boxes.rs`).
            .args(agent.then_some("--disable-network"))
            // The node's disk is the build machine's, often past the kubelet's default
            // `nodefs.available<10%` (target dirs): DiskPressure would taint the node and no
            // pod would schedule. The tests keep memory's default and a 1 % disk floor.
            // A test that sets its own `--eviction-hard` keeps it.
            .args(
                (agent && !extra.iter().any(|a| a.starts_with("--eviction-hard")))
                    .then_some(EVICTION_HARD_FOR_TESTS),
            )
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("server.log")).expect("log file"))
            .spawn()
            .expect("start skerry");
        let kube = Kube {
            _child: KilledOnDrop(child),
            etcd: format!("http://127.0.0.1:{etcd_port}"),
            kubeconfig: data.join("admin.kubeconfig"),
            home,
            dir,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if kube.kubeconfig.exists() {
                let out = kube.kubectl_output(&["get", "--raw", "/readyz"], None);
                // Ready, and the controllers are running: the `default` ServiceAccount
                // exists, which the ServiceAccount admission requires of every pod in
                // `default` (a client would retry the 403; the tests create pods at once).
                if out.status.success()
                    && kube
                        .kubectl_output(&["get", "serviceaccount", "default"], None)
                        .status
                        .success()
                {
                    return kube;
                }
            }
            assert!(
                Instant::now() < deadline,
                "skerry not ready in {READY_TIMEOUT:?}\n{}",
                kube.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(KUBECTL);
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.home)
            .env_remove("KUBECTL_EXTERNAL_DIFF");
        c
    }

    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = self.command(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("run kubectl");
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

    /// Runs kubectl, which must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_in(args, None)
    }

    pub fn ok_in(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_output(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\nstdout: {}\nstderr: {}\nserver log tail:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log())
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl, which must fail; returns stderr.
    pub fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_output(args, stdin);
        assert!(
            !out.status.success(),
            "kubectl {args:?} should have failed:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// One member of a three-member cluster, killed on drop.
pub struct Member {
    pub _child: KilledOnDrop,
    pub kubeconfig: PathBuf,
    pub log: PathBuf,
    /// Its etcd client port (`http://127.0.0.1:PORT`).
    pub client_port: u16,
    /// Its Raft peer port.
    pub peer_port: u16,
    /// Its Kubernetes API port (HTTPS).
    pub api_port: u16,
}

pub fn kubectl_as(kubeconfig: &Path, home: &Path, args: &[&str]) -> Output {
    Command::new(KUBECTL)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .output()
        .expect("run kubectl")
}

/// Retries `args` against `kubeconfig` until it succeeds (a cluster electing a leader answers
/// 503/504 for a moment), returning stdout.
pub fn eventually(kubeconfig: &Path, home: &Path, args: &[&str], log: &Path) -> String {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let out = kubectl_as(kubeconfig, home, args);
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "kubectl {args:?} kept failing: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            tail(&std::fs::read_to_string(log).unwrap_or_default())
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Three members of one cluster (`n1`, `n2`, `n3`) on loopback ports, sharing one PKI
/// directory so one kubeconfig's CA trusts every member.
pub struct Cluster {
    /// The members; a test drops one to lose a box.
    pub members: Vec<Member>,
    /// The `HOME` kubectl runs with.
    pub home: PathBuf,
    /// Holds the data dirs, logs and PKI.
    pub root: tempfile::TempDir,
}

impl Cluster {
    /// Starts three members and waits until each serves `/readyz`.
    pub fn start() -> Cluster {
        let root = tempfile::tempdir().expect("tempdir");
        let home = root.path().join("home");
        std::fs::create_dir_all(&home).expect("home");
        let pki = root.path().join("pki");
        let names = ["n1", "n2", "n3"];
        let peer_ports: Vec<u16> = names.iter().map(|_| free_port()).collect();
        let initial = names
            .iter()
            .zip(&peer_ports)
            .map(|(n, p)| format!("{n}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let start = |i: usize| -> Member {
            let data = root.path().join(names[i]);
            let log = root.path().join(format!("{}.log", names[i]));
            let peer = format!("http://127.0.0.1:{}", peer_ports[i]);
            let (client_port, api_port) = (free_port(), free_port());
            let child = Command::new(env!("CARGO_BIN_EXE_skerry"))
                .args([
                    "server",
                    "--name",
                    names[i],
                    "--data-dir",
                    &data.display().to_string(),
                    "--listen-client-urls",
                    &format!("http://127.0.0.1:{client_port}"),
                    "--initial-cluster",
                    &initial,
                    "--listen-peer-urls",
                    &peer,
                    "--initial-advertise-peer-urls",
                    &peer,
                    "--bind-address",
                    "127.0.0.1",
                    "--secure-port",
                    &api_port.to_string(),
                    // One CA for the cluster: every member reads the same PKI directory.
                    "--pki-dir",
                    &pki.display().to_string(),
                    "--disable-agent",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log"))
                .spawn()
                .expect("start member");
            Member {
                _child: KilledOnDrop(child),
                kubeconfig: data.join("admin.kubeconfig"),
                log,
                client_port,
                peer_port: peer_ports[i],
                api_port,
            }
        };
        // The first member creates the PKI; the others start once it exists, so they read it
        // rather than race to create their own.
        let mut members = vec![start(0)];
        let deadline = Instant::now() + READY_TIMEOUT;
        while !pki.join("ca.crt").exists() {
            assert!(Instant::now() < deadline, "no PKI created");
            std::thread::sleep(Duration::from_millis(100));
        }
        members.push(start(1));
        members.push(start(2));
        for m in &members {
            let deadline = Instant::now() + READY_TIMEOUT;
            while !m.kubeconfig.exists() {
                assert!(Instant::now() < deadline, "no kubeconfig written");
                std::thread::sleep(Duration::from_millis(100));
            }
            eventually(&m.kubeconfig, &home, &["get", "--raw", "/readyz"], &m.log);
        }
        Cluster {
            members,
            home,
            root,
        }
    }
}
