//! What the node benchmarks (`skerry-podstartup`, `skerry-evictionbench`) share: one real
//! `skerry server` with its node agent in a temp dir, reached with the real kubectl, its
//! busybox image imported, stopped with SIGTERM and its leftovers removed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use skerry_node::cni;
use skerry_node::testing::remove_leftovers;

/// The image the benchmarks build from busybox-static and import (present before any pod).
pub const IMAGE: &str = "skerry.bench/busybox:1";
/// The kubectl users run.
pub const KUBECTL: &str = "/usr/bin/kubectl";
/// How long the node gets to turn Ready (a release build takes seconds; the slack is for a
/// loaded 2-core machine).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stopping server gets to stop its containerd before its leftovers are removed.
const STOP_TIMEOUT: Duration = Duration::from_secs(40);

/// Nanoseconds since the epoch, the clock containerd's stamps and the log's use.
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The `p`th percentile (nearest rank) of sorted values; NaN when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A running `skerry server`, stopped on drop.
pub struct Server {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub cgroup_root: String,
}

impl Server {
    /// Starts `skerry server` named `node` with `flags` beside the benchmarks' own (loopback
    /// ports, a cgroup root of its own), waits for the Node to be Ready and imports
    /// [`IMAGE`]. `name` tells the temp dir and the cgroup root apart.
    pub fn start(skerry: &Path, name: &str, node: &str, flags: &[String]) -> Result<Server> {
        let dir = tempfile::Builder::new().prefix(name).tempdir_in("/tmp")?;
        let data = dir.path().join("data");
        let cgroup_root = format!("/skerry-{name}-{}", std::process::id());
        let port = || -> Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port())
        };
        let child = Command::new(skerry)
            .args(["server", "--data-dir"])
            .arg(&data)
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{}", port()?),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &port()?.to_string(),
                "--kubelet-port",
                &port()?.to_string(),
                "--hostname-override",
                node,
                "--cgroup-root",
                &cgroup_root,
                // Pod start-up and eviction are measured without the network's own work.
                "--disable-network",
            ])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("server.log"))?)
            .spawn()
            .with_context(|| format!("start {}", skerry.display()))?;
        let server = Server {
            child,
            dir,
            cgroup_root,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(n) = server.kubectl(&["get", "node", node, "-o", "json"], None) {
                let n: Value = serde_json::from_str(&n)?;
                let ready = n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                if ready {
                    break;
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "node not Ready; see {}/server.log",
                    server.dir.path().display()
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let archive = server.dir.path().join("busybox.tar");
        skerry_node::images::build::busybox_image(
            Path::new(skerry_node::images::build::BUSYBOX),
            IMAGE,
        )?
        .write_oci_archive(&archive)?;
        let out = Command::new(skerry)
            .args(["images", "import", "--data-dir"])
            .arg(&data)
            .arg(&archive)
            .output()?;
        if !out.status.success() {
            bail!("import: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(server)
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The supervised containerd's socket.
    pub fn socket(&self) -> PathBuf {
        self.data().join("agent/run/containerd.sock")
    }

    /// Runs kubectl as the admin, `stdin` fed to it; its stdout, or its stderr as the error.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut child = Command::new(KUBECTL)
            .args(args)
            .env("KUBECONFIG", self.data().join("admin.kubeconfig"))
            .env("HOME", self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("run kubectl")?;
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .context("stdin")?
                .write_all(text.as_bytes())?;
        }
        drop(child.stdin.take());
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // What the run leaves behind (see `skerry_node::testing`), and the bridge the CNI
        // plugins never delete.
        remove_leftovers(&self.socket(), self.dir.path(), &self.cgroup_root);
        let _ = Command::new("ip")
            .args(["link", "del", cni::BRIDGE_DEFAULT])
            .output();
    }
}
