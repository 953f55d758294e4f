//! What tests and benchmarks that run real pods leave behind, removed: the shims of their own
//! containerd (and so the containers, which die with the shim's pid namespace or their
//! cgroup), the processes still in their cgroups, what the node mounted under their directory
//! (volumes, the snapshotter's overlays, the sandboxes' namespaces), and their cgroups on
//! every v1 hierarchy and on v2.
//!
//! containerd keeps shims and containers running when it stops (as with systemd's
//! `KillMode=process`), which is what a node wants and what a test must undo. Only built
//! with the `testing` feature.
//!
//! [`device_plugin`]: a device plugin for tests, served in the test's process.

pub mod device_plugin;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

/// Time for killed processes to go before their mounts and cgroups are removed.
const SETTLE: Duration = Duration::from_millis(200);

/// Kills the shims serving `socket` and every process in a cgroup under `cgroup_root`,
/// unmounts what is mounted under `dir` (innermost first), and removes the cgroups under
/// `cgroup_root`. Best effort: what cannot be removed is left, nothing panics.
pub fn remove_leftovers(socket: &Path, dir: &Path, cgroup_root: &str) {
    let socket = socket.display().to_string();
    let cgroup_prefix = format!("{}/", cgroup_root.trim_end_matches('/'));
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let our_shim = args
            .windows(2)
            .any(|w| w[0] == b"-address" && w[1] == socket.as_bytes());
        let cgroups = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        let in_our_cgroup = cgroups.lines().any(|l| {
            l.split(':')
                .nth(2)
                .is_some_and(|p| p.starts_with(&cgroup_prefix))
        });
        if (our_shim || in_our_cgroup)
            && let Some(pid) = Pid::from_raw(pid)
        {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
    std::thread::sleep(SETTLE);
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
    let mut roots: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    roots.push(PathBuf::from("/sys/fs/cgroup"));
    for root in roots {
        remove_cgroup_tree(&root.join(cgroup_root.trim_start_matches('/')));
    }
}

/// Removes a cgroup and its children, killing what is still in each first.
fn remove_cgroup_tree(path: &Path) {
    if !path.is_dir() {
        return;
    }
    for child in std::fs::read_dir(path).into_iter().flatten().flatten() {
        if child.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&child.path());
        }
    }
    if let Ok(procs) = std::fs::read_to_string(path.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if let Some(pid) = Pid::from_raw(pid) {
                let _ = kill_process(pid, Signal::KILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir(path);
}
