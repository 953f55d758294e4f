//! A supervised containerd in a temp dir, for the node's tests: started by skerry's own
//! supervisor, with the pause and busybox images built by skerry's builder, and torn down on
//! drop (even when the test panics): the containerd, the shims serving its socket, their
//! mounts and the test's cgroups.
//!
//! These tests need root, containerd, runc, catatonit and busybox-static. Without them they
//! skip with a message, except under `CI=true`, where a missing tool is a failure.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

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

pub use skerry_node::testing::remove_leftovers as cleanup;
