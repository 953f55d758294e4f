//! What the Summary reads from the host besides cgroups: file-system usage (`statvfs` and a
//! bounded `du`), network counters from a network namespace's `/proc/<pid>/net/dev`, the
//! task limits (`pkg/kubelet/stats/pidlimit/pidlimit_linux.go`) and the boot time.

use std::path::Path;

use super::types::{FsStats, InterfaceStats, RlimitStats, time};

/// The most entries one `du` walk visits (a volume or a log directory): past it the usage
/// is what was counted so far, so a volume holding millions of files costs a bounded scan
/// per scrape (upstream's `du` runs unbounded, under a timeout).
pub const DU_MAX_ENTRIES: usize = 100_000;

/// The interface whose counters the Summary puts inline (`network.DefaultInterfaceName`).
pub const DEFAULT_INTERFACE: &str = "eth0";

/// Interfaces cAdvisor leaves out of a container's network stats (`isIgnoredDevice`: the
/// loopback, and host-side veth and bridge ends).
const IGNORED_INTERFACE_PREFIXES: &[&str] = &["lo", "veth", "docker", "nerdctl"];

/// `statvfs` of the file system holding `dir`: capacity, available, inodes (used bytes:
/// capacity minus free, as cAdvisor's `RootFsInfo`).
pub fn statvfs(dir: &Path, at: u64) -> Option<FsStats> {
    let st = rustix::fs::statvfs(dir).ok()?;
    let capacity = st.f_blocks.saturating_mul(st.f_frsize);
    let free = st.f_bfree.saturating_mul(st.f_frsize);
    Some(FsStats {
        time: time(at),
        available_bytes: Some(st.f_bavail.saturating_mul(st.f_frsize)),
        capacity_bytes: Some(capacity),
        used_bytes: Some(capacity.saturating_sub(free)),
        inodes_free: Some(st.f_ffree),
        inodes: Some(st.f_files),
        inodes_used: Some(st.f_files.saturating_sub(st.f_ffree)),
    })
}

/// Bytes on disk and inodes under `path` (`du -s` and `find | wc -l` as the kubelet's
/// `volume/util/fs` measures a volume), symlinks not followed, at most [`DU_MAX_ENTRIES`].
pub fn du(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::symlink_metadata(path).ok()?;
    let mut bytes = meta.blocks().saturating_mul(512);
    let mut inodes = 1u64;
    let mut stack = vec![path.to_path_buf()];
    let mut visited = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            visited += 1;
            if visited > DU_MAX_ENTRIES {
                return Some((bytes, inodes));
            }
            let Ok(m) = e.metadata() else { continue };
            bytes = bytes.saturating_add(m.blocks().saturating_mul(512));
            inodes += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Some((bytes, inodes))
}

/// The interfaces of a `/proc/<pid>/net/dev` text, ignored ones left out.
pub fn parse_net_dev(text: &str) -> Vec<InterfaceStats> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if IGNORED_INTERFACE_PREFIXES
                .iter()
                .any(|p| name.starts_with(p))
            {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes packets errs ...
            Some(InterfaceStats {
                name: name.to_string(),
                rx_bytes: f.first().copied(),
                rx_errors: f.get(2).copied(),
                tx_bytes: f.get(8).copied(),
                tx_errors: f.get(10).copied(),
            })
        })
        .collect()
}

/// `pidlimit.Stats`: the smaller of `kernel.pid_max` and `kernel.threads-max`, and the tasks
/// that exist (the total of `/proc/loadavg`'s fourth field; `sysinfo` truncates).
pub fn rlimit(pid_max: &str, threads_max: &str, loadavg: &str, at: u64) -> RlimitStats {
    let max = [pid_max, threads_max]
        .iter()
        .map(|t| t.trim().parse::<i64>().ok())
        .collect::<Option<Vec<_>>>()
        .and_then(|v| v.into_iter().min());
    let curproc = loadavg
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split_once('/'))
        .and_then(|(_, total)| total.parse().ok());
    RlimitStats {
        time: time(at),
        maxpid: max,
        curproc,
    }
}

/// The boot time in ns since the epoch (`btime` of `/proc/stat`): the root cgroup's start.
pub fn boot_time_ns(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| s.saturating_mul(1_000_000_000))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn net_dev_without_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
            face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
            lo:  100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  \
            eth0: 5000 40 2 0 0 0 0 0 7000 30 1 0 0 0 0 0\n";
        let ifs = parse_net_dev(text);
        assert_eq!(ifs.len(), 1);
        assert_eq!(ifs[0].name, "eth0");
        assert_eq!(
            (
                ifs[0].rx_bytes,
                ifs[0].rx_errors,
                ifs[0].tx_bytes,
                ifs[0].tx_errors
            ),
            (Some(5000), Some(2), Some(7000), Some(1))
        );
    }

    #[test]
    fn rlimit_takes_the_smaller_limit_and_the_task_total() {
        let r = rlimit("4194304\n", "63704\n", "0.12 0.30 0.25 2/713 12345\n", 0);
        assert_eq!(r.maxpid, Some(63_704));
        assert_eq!(r.curproc, Some(713));
        assert_eq!(rlimit("x", "1", "", 0).maxpid, None);
    }

    #[test]
    fn boot_time_and_du() {
        assert_eq!(
            boot_time_ns("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000_000_000_000)
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![7u8; 64 * 1024]).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/b"), b"x").unwrap();
        let (bytes, inodes) = du(dir.path()).unwrap();
        assert_eq!(inodes, 4);
        assert!(bytes >= 64 * 1024, "{bytes}");
    }
}
