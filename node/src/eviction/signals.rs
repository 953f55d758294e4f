//! The eviction signals observed in the kubelet's Summary (upstream
//! `pkg/kubelet/eviction/helpers.go` `makeSignalObservations`): the figures come from
//! `crate::stats::StatsProvider`, the same ones `/stats/summary` serves, so what the
//! eviction manager acts on is what an operator can read.
//!
//! - `memory.available`: the root cgroup's `availableBytes` (capacity minus working set,
//!   the working set being usage minus `inactive_file`), against capacity = available +
//!   working set;
//! - `allocatableMemory.available`: the same of the pods' cgroup (`kubepods`, the `pods`
//!   system container), whose limit is allocatable;
//! - `nodefs.*`: statvfs of the kubelet's root dir; `imagefs.*` and `containerfs.*`: of
//!   the runtime's image filesystem (CRI `ImageFsInfo`);
//! - `pid.available`: `pid_max` minus the processes the kernel counts (`rlimit`).

use super::thresholds::{Observation, Observations};
use crate::machine::signals;
use crate::stats::types::{FsStats, SYSTEM_CONTAINER_PODS, Summary};

fn put(out: &mut Observations, signal: &str, available: Option<u64>, capacity: Option<u64>) {
    if let (Some(a), Some(c)) = (available, capacity) {
        out.insert(
            signal.to_string(),
            Observation {
                available: i128::from(a),
                capacity: i128::from(c),
            },
        );
    }
}

fn fs(out: &mut Observations, fs: Option<&FsStats>, bytes: &str, inodes: &str) {
    let Some(fs) = fs else { return };
    put(out, bytes, fs.available_bytes, fs.capacity_bytes);
    put(out, inodes, fs.inodes_free, fs.inodes);
}

/// `makeSignalObservations`: every signal the Summary has figures for.
pub fn observations(summary: &Summary) -> Observations {
    let mut out = Observations::new();
    let node = &summary.node;
    if let Some(m) = &node.memory
        && let (Some(a), Some(ws)) = (m.available_bytes, m.working_set_bytes)
    {
        put(&mut out, signals::MEMORY_AVAILABLE, Some(a), Some(a + ws));
    }
    if let Some(m) = node
        .system_containers
        .iter()
        .find(|c| c.name == SYSTEM_CONTAINER_PODS)
        .and_then(|c| c.memory.as_ref())
        && let (Some(a), Some(ws)) = (m.available_bytes, m.working_set_bytes)
    {
        put(
            &mut out,
            signals::ALLOCATABLE_MEMORY_AVAILABLE,
            Some(a),
            Some(a + ws),
        );
    }
    fs(
        &mut out,
        node.fs.as_ref(),
        signals::NODEFS_AVAILABLE,
        signals::NODEFS_INODES_FREE,
    );
    if let Some(rt) = &node.runtime {
        fs(
            &mut out,
            rt.image_fs.as_ref(),
            signals::IMAGEFS_AVAILABLE,
            signals::IMAGEFS_INODES_FREE,
        );
        fs(
            &mut out,
            rt.container_fs.as_ref(),
            signals::CONTAINERFS_AVAILABLE,
            signals::CONTAINERFS_INODES_FREE,
        );
    }
    if let Some(r) = &node.rlimit
        && let (Some(max), Some(cur)) = (r.maxpid, r.curproc)
    {
        out.insert(
            signals::PID_AVAILABLE.to_string(),
            Observation {
                available: i128::from(max - cur),
                capacity: i128::from(max),
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_from_a_summary() {
        let summary: Summary = serde_json::from_value(serde_json::json!({
            "node": {
                "nodeName": "n", "startTime": "",
                "memory": {"time": "", "availableBytes": 600, "workingSetBytes": 400},
                "systemContainers": [
                    {"name": "kubelet", "startTime": "", "memory": {"time": "", "availableBytes": 1, "workingSetBytes": 1}},
                    {"name": "pods", "startTime": "", "memory": {"time": "", "availableBytes": 100, "workingSetBytes": 300}}
                ],
                "fs": {"time": "", "availableBytes": 10, "capacityBytes": 100, "inodesFree": 5, "inodes": 50},
                "runtime": {"imageFs": {"time": "", "availableBytes": 20, "capacityBytes": 200}},
                "rlimit": {"time": "", "maxpid": 4096, "curproc": 96}
            },
            "pods": []
        }))
        .expect("summary");
        let o = observations(&summary);
        let get = |s: &str| o.get(s).map(|o| (o.available, o.capacity));
        assert_eq!(get("memory.available"), Some((600, 1000)));
        assert_eq!(get("allocatableMemory.available"), Some((100, 400)));
        assert_eq!(get("nodefs.available"), Some((10, 100)));
        assert_eq!(get("nodefs.inodesFree"), Some((5, 50)));
        assert_eq!(get("imagefs.available"), Some((20, 200)));
        assert_eq!(get("imagefs.inodesFree"), None);
        assert_eq!(get("pid.available"), Some((4000, 4096)));
    }
}
