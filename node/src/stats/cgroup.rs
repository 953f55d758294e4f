//! CPU and memory of one cgroup, read from its files as cAdvisor reads them through
//! libcontainer (`cadvisor/container/libcontainer/handler.go` `setCPUStats`,
//! `setMemoryStats`), on either layout of [`CgroupManager`]:
//! - v1: `cpuacct.usage` (ns) in the `cpuacct` hierarchy; `memory.usage_in_bytes`,
//!   `memory.limit_in_bytes` and `memory.stat` (`total_inactive_file`, `total_rss`,
//!   `pgfault`, `pgmajfault`) in the `memory` hierarchy;
//! - v2: `cpu.stat` `usage_usec`; `memory.current`, `memory.max` and `memory.stat`
//!   (`inactive_file`, `anon`, `pgfault`, `pgmajfault`). The root of a v2 tree has no
//!   `memory.current`: usage is then `MemTotal - MemFree` of `/proc/meminfo`, as
//!   libcontainer's `rootStatsFromMeminfo`.
//!
//! The working set is usage minus inactive file pages (cAdvisor: the kernel may drop those
//! under pressure, so they do not count against a container), never below zero.

use std::collections::HashMap;
use std::path::Path;

use crate::cgroups::CgroupManager;

/// A memory limit above this is no limit (cAdvisor's `maxMemorySize`, 1 << 62: v1 writes
/// "unlimited" as a page-rounded `i64::MAX`).
pub const UNLIMITED_MEMORY: u64 = 1 << 62;

/// What a cgroup's memory files say, in bytes (counts for the faults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// `memory.usage_in_bytes` / `memory.current`.
    pub usage: u64,
    /// Usage minus inactive file pages.
    pub working_set: u64,
    /// Anonymous and swap cache memory (`total_rss` / `anon`).
    pub rss: u64,
    /// Page faults.
    pub page_faults: u64,
    /// Major page faults.
    pub major_page_faults: u64,
    /// The limit, when there is one.
    pub limit: Option<u64>,
}

/// The `key value` lines of a `memory.stat` or `cpu.stat` file.
pub fn parse_flat_keyed(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?, f.next()?.parse().ok()?))
        })
        .collect()
}

/// A number file (`max` or a value above [`UNLIMITED_MEMORY`] is no limit: `None`).
pub fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|v| *v < UNLIMITED_MEMORY)
}

/// cAdvisor's working set: usage minus `inactive_file`, zero when inactive exceeds usage.
pub fn working_set(usage: u64, inactive_file: u64) -> u64 {
    usage.saturating_sub(inactive_file)
}

/// v1 memory from `memory.usage_in_bytes`, `memory.stat` and `memory.limit_in_bytes`.
pub fn memory_v1(usage: &str, stat: &str, limit: &str) -> Option<Memory> {
    let usage: u64 = usage.trim().parse().ok()?;
    let stat = parse_flat_keyed(stat);
    let get = |k: &str| stat.get(k).copied().unwrap_or(0);
    Some(Memory {
        usage,
        working_set: working_set(usage, get("total_inactive_file")),
        rss: get("total_rss"),
        page_faults: get("pgfault"),
        major_page_faults: get("pgmajfault"),
        limit: parse_limit(limit),
    })
}

/// v2 memory from `memory.current`, `memory.stat` and `memory.max`.
pub fn memory_v2(current: &str, stat: &str, max: &str) -> Option<Memory> {
    let usage: u64 = current.trim().parse().ok()?;
    let stat = parse_flat_keyed(stat);
    let get = |k: &str| stat.get(k).copied().unwrap_or(0);
    Some(Memory {
        usage,
        working_set: working_set(usage, get("inactive_file")),
        rss: get("anon"),
        page_faults: get("pgfault"),
        major_page_faults: get("pgmajfault"),
        limit: parse_limit(max),
    })
}

/// v1 CPU: `cpuacct.usage`, nanoseconds.
pub fn cpu_v1(usage: &str) -> Option<u64> {
    usage.trim().parse().ok()
}

/// v2 CPU: `usage_usec` of `cpu.stat`, in nanoseconds.
pub fn cpu_v2(stat: &str) -> Option<u64> {
    parse_flat_keyed(stat)
        .get("usage_usec")
        .map(|u| u.saturating_mul(1000))
}

/// The fields of `/proc/meminfo` in bytes (`MemTotal`, `MemFree`, `SwapTotal`...).
pub fn parse_meminfo(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let mut f = v.split_whitespace();
            let n: u64 = f.next()?.parse().ok()?;
            let unit = if f.next() == Some("kB") { 1024 } else { 1 };
            Some((k, n.saturating_mul(unit)))
        })
        .collect()
}

fn read(dir: &Path, file: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(file)).ok()
}

/// CPU time (ns) and memory of `name`; `None` for what cannot be read (a cgroup gone).
pub fn sample(cgroups: &CgroupManager, name: &str) -> (Option<u64>, Option<Memory>) {
    if cgroups.is_v2() {
        let Some(dir) = cgroups.path("cpu", name) else {
            return (None, None);
        };
        let cpu = read(&dir, "cpu.stat").and_then(|t| cpu_v2(&t));
        let stat = read(&dir, "memory.stat");
        let memory = match (read(&dir, "memory.current"), &stat) {
            (Some(current), Some(stat)) => memory_v2(
                &current,
                stat,
                &read(&dir, "memory.max").unwrap_or_default(),
            ),
            // The root: no `memory.current` (libcontainer's `rootStatsFromMeminfo`).
            (None, Some(stat)) if name.trim_matches('/').is_empty() => {
                let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
                let info = parse_meminfo(&info);
                let usage = info
                    .get("MemTotal")
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(info.get("MemFree").copied().unwrap_or(0));
                memory_v2(&usage.to_string(), stat, "max")
            }
            _ => None,
        };
        (cpu, memory)
    } else {
        let cpu = cgroups
            .path("cpuacct", name)
            .and_then(|d| read(&d, "cpuacct.usage"))
            .and_then(|t| cpu_v1(&t));
        let memory = cgroups.path("memory", name).and_then(|d| {
            memory_v1(
                &read(&d, "memory.usage_in_bytes")?,
                &read(&d, "memory.stat")?,
                &read(&d, "memory.limit_in_bytes").unwrap_or_default(),
            )
        });
        (cpu, memory)
    }
}

/// The cgroup of process `pid` in the hierarchy that holds `controller` (v1), or its
/// unified cgroup (v2), from `/proc/<pid>/cgroup` (`hierarchy-id:controllers:path`).
pub fn process_cgroup(cgroup_file: &str, controller: &str, v2: bool) -> Option<String> {
    cgroup_file.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let hit = if v2 {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        hit.then(|| path.to_string())
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    const V1_STAT: &str = "cache 1000\nrss 300\npgfault 7\npgmajfault 1\ninactive_file 50\n\
                           total_cache 40960\ntotal_rss 104857600\ntotal_inactive_file 8192\n\
                           total_pgfault 99\n";

    #[test]
    fn v1_working_set_is_usage_minus_total_inactive_file() {
        let m = memory_v1("110000000\n", V1_STAT, "9223372036854771712\n").unwrap();
        assert_eq!(m.usage, 110_000_000);
        assert_eq!(m.working_set, 110_000_000 - 8192);
        assert_eq!(m.rss, 104_857_600);
        assert_eq!((m.page_faults, m.major_page_faults), (7, 1));
        assert_eq!(m.limit, None, "v1's unlimited is no limit");
        let limited = memory_v1("10", V1_STAT, "268435456").unwrap();
        assert_eq!(limited.limit, Some(268_435_456));
        assert_eq!(
            limited.working_set, 0,
            "inactive above usage floors at zero"
        );
    }

    #[test]
    fn v2_memory_and_cpu() {
        let stat = "anon 2097152\nfile 4096\ninactive_file 4096\npgfault 12\npgmajfault 3\n";
        let m = memory_v2("3000000\n", stat, "max\n").unwrap();
        assert_eq!(m.working_set, 3_000_000 - 4096);
        assert_eq!(m.rss, 2_097_152);
        assert_eq!((m.page_faults, m.major_page_faults), (12, 3));
        assert_eq!(m.limit, None);
        assert_eq!(
            memory_v2("1", stat, "1048576").unwrap().limit,
            Some(1_048_576)
        );
        let cpu = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n";
        assert_eq!(cpu_v2(cpu), Some(1_500_000));
        assert_eq!(cpu_v1("123456789\n"), Some(123_456_789));
        assert_eq!(cpu_v1("garbage"), None);
    }

    #[test]
    fn meminfo_is_in_bytes() {
        let info =
            parse_meminfo("MemTotal:       16384 kB\nMemFree:  1024 kB\nHugePages_Total: 0\n");
        assert_eq!(info["MemTotal"], 16_384 * 1024);
        assert_eq!(info["HugePages_Total"], 0);
    }

    #[test]
    fn a_process_cgroup_per_layout() {
        let v1 = "12:memory:/user.slice\n4:cpu,cpuacct:/user.slice/x\n0::/user.slice/y\n";
        assert_eq!(
            process_cgroup(v1, "cpuacct", false).unwrap(),
            "/user.slice/x"
        );
        assert_eq!(process_cgroup(v1, "memory", false).unwrap(), "/user.slice");
        assert_eq!(process_cgroup(v1, "memory", true).unwrap(), "/user.slice/y");
    }
}
