//! A supervised containerd in a temp dir, for the node's tests: started by skerry's own
//! supervisor, with the pause and busybox images built by skerry's builder, and torn down on
//! drop (even when the test panics): the containerd, the shims serving its socket, their
//! mounts and the test's cgroups.
//!
//! These tests need root, containerd, runc, catatonit and busybox-static. Without them they
//! skip with a message, except under `CI=true`, where a missing tool is a failure.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use skerry_node::containerd::api::ContainerdApi;
use skerry_node::containerd::{Containerd, ContainerdConfig, find_on_path};
use skerry_node::cri::Cri;
use skerry_node::images::{self, build};

/// The name the tests import busybox under.
pub const BUSYBOX_IMAGE: &str = "skerry.test/busybox:1";

/// Whether this machine can run the runtime tests; `None` when it can, else why not. Under
/// `CI=true` a missing prerequisite panics instead.
pub fn missing_prerequisite() -> Option<String> {
    let mut missing = Vec::new();
    if !rustix::process::geteuid().is_root() {
        missing.push("root".to_string());
    }
    for bin in ["containerd", "containerd-shim-runc-v2", "runc"] {
        if find_on_path(bin).is_none() {
            missing.push(format!("{bin} (Debian: containerd, runc)"));
        }
    }
    if !Path::new(build::CATATONIT).exists() {
        missing.push("catatonit (Debian: catatonit)".into());
    }
    if !Path::new(build::BUSYBOX).exists() {
        missing.push("busybox (Debian: busybox-static)".into());
    }
    if missing.is_empty() {
        return None;
    }
    let why = format!("runtime tests need: {}", missing.join(", "));
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{why}");
    }
    eprintln!("skipping: {why}");
    Some(why)
}

/// A containerd in a temp dir.
pub struct TestRuntime {
    pub dir: tempfile::TempDir,
    pub containerd: Option<Containerd>,
    pub cri: Cri,
    pub api: ContainerdApi,
    pub socket: PathBuf,
    /// The cgroup parent of this test's pods (`/skerry-test-<pid>-<n>`).
    pub cgroup_parent: String,
}

impl TestRuntime {
    /// Starts containerd under a fresh temp dir. The dir's path is short: unix socket paths
    /// are limited to 107 bytes.
    pub async fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("skr")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let containerd = Containerd::start(ContainerdConfig {
            data_dir: dir.path().to_path_buf(),
            sandbox_image: build::PAUSE_IMAGE.to_string(),
            binary: None,
        })
        .await
        .expect("containerd starts");
        let cri = containerd.cri().clone();
        let socket = containerd.layout().socket.clone();
        let api = images::k8s_api(&socket);
        let cgroup_parent = format!(
            "/skerry-test-{}-{}",
            std::process::id(),
            dir.path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        Self {
            dir,
            containerd: Some(containerd),
            cri,
            api,
            socket,
            cgroup_parent,
        }
    }

    /// Builds and imports the pause image.
    pub async fn import_pause(&self) -> images::ImportReport {
        images::import_pause_image(&self.api, Path::new(build::CATATONIT), self.dir.path())
            .await
            .expect("pause image imports")
    }

    /// Builds busybox into an OCI layout tarball in the temp dir; returns its path.
    pub fn busybox_archive(&self) -> PathBuf {
        let path = self.dir.path().join("busybox.tar");
        build::busybox_image(Path::new(build::BUSYBOX), BUSYBOX_IMAGE)
            .expect("busybox image")
            .write_oci_archive(&path)
            .expect("write busybox");
        path
    }

    /// The data dir.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops containerd and everything the test left.
    pub async fn shutdown(mut self) {
        if let Some(containerd) = self.containerd.take() {
            containerd.stop().await;
        }
        cleanup(&self.socket, self.dir.path(), &self.cgroup_parent);
    }
}

impl Drop for TestRuntime {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.dir.path().join("agent/containerd.log");
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- the end of {}:", log.display());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
        if let Some(containerd) = self.containerd.take() {
            // A panicking test: no runtime to await the supervisor on; kill containerd by pid.
            let pid = containerd.pid();
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            drop(containerd);
        }
        cleanup(&self.socket, self.dir.path(), &self.cgroup_parent);
    }
}

/// Kills the shims serving `socket` (and so their containers), unmounts what is mounted under
/// `dir`, and removes the test's cgroups.
pub fn cleanup(socket: &Path, dir: &Path, cgroup_parent: &str) {
    let socket = socket.display().to_string();
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for entry in procs.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_shim = args
                .first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
            let ours = args
                .windows(2)
                .any(|w| w[0] == b"-address" && w[1] == socket.as_bytes());
            // The shim's children (the containers) die with their pid namespace, or with
            // their cgroup below.
            if is_shim
                && ours
                && let Some(pid) = rustix::process::Pid::from_raw(pid)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    // Innermost mounts first.
    let dir = dir.display().to_string();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(str::to_string))
        .filter(|mount| mount.starts_with(&dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount in mounts {
        let _ = rustix::mount::unmount(mount.as_str(), rustix::mount::UnmountFlags::DETACH);
    }
    // Containers' cgroups under the test's parent, on every v1 hierarchy and on v2.
    if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
        let mut roots: Vec<PathBuf> = hierarchies.flatten().map(|e| e.path()).collect();
        roots.push(PathBuf::from("/sys/fs/cgroup"));
        for root in roots {
            let parent = root.join(cgroup_parent.trim_start_matches('/'));
            remove_cgroup_tree(&parent);
        }
    }
}

fn remove_cgroup_tree(path: &Path) {
    if !path.is_dir() {
        return;
    }
    if let Ok(children) = std::fs::read_dir(path) {
        for child in children.flatten() {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&child.path());
            }
        }
    }
    // Any process left in it is killed first.
    if let Ok(procs) = std::fs::read_to_string(path.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir(path);
}
