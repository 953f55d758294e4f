//! The kubelet's cgroups with the `cgroupfs` driver (upstream `pkg/kubelet/cm`:
//! `cgroup_manager_linux.go`, `helpers_linux.go`, `qos_container_manager_linux.go`,
//! `pod_container_manager_linux.go`, `node_container_manager_linux.go`).
//!
//! [`CgroupManager`] creates, updates, reads back and removes a cgroup over the real file
//! system on either layout, found in `/proc/self/mountinfo`:
//! - v1 (and the hybrid layout of systemd hosts): one hierarchy per controller or group of
//!   controllers (`cpu`, `memory`, `pids`, `cpuset`...), plus the unified mount that holds
//!   only some controllers (or none) beside them. A cgroup is a directory of the same
//!   absolute path in every hierarchy, as runc's `cgroupfs` driver places a container's;
//!   the limits go to `cpu.shares`, `cpu.cfs_quota_us`, `cpu.cfs_period_us`,
//!   `memory.limit_in_bytes`, `pids.max`.
//! - v2 (unified, `/sys/fs/cgroup` itself a `cgroup2` mount): one tree; a controller works
//!   in a child only once every ancestor lists it in `cgroup.subtree_control`, so creating
//!   a cgroup enables the available controllers down the path first; the limits go to
//!   `cpu.weight` (shares converted as runc's `CpuSharesToCpuWeight`), `cpu.max`,
//!   `memory.max`, `pids.max`.
//!
//! Hugepage limits (`hugetlb.<size>.limit_in_bytes` on v1, `hugetlb.<size>.max` on v2) go to
//! the hugetlb hierarchy wherever it is: a v1 one, the unified tree, or, on a hybrid host
//! whose v1 set lacks it, the unified mount beside the v1 hierarchies (runc's `cgroupfs`
//! driver places a container in that mount too, so the pod's limit caps its containers).
//!
//! The trick it carries: the cgroup names are runc's own (`cgroupsPath` absolute from each
//! hierarchy's root), so the kubelet creates the QoS and pod cgroups with their limits and
//! runc then creates the containers' cgroups beneath them, where the kernel caps a child by
//! its parents. [`pod`] holds what the kubelet puts there.

pub mod pod;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Fewest CPU shares a cgroup gets (`helpers_linux.go` `MinShares`: the kernel's minimum).
pub const MIN_SHARES: u64 = 2;
/// Most CPU shares (`helpers_linux.go` `MaxShares`: the kernel's maximum).
pub const MAX_SHARES: u64 = 262_144;
/// Shares of one CPU (`SharesPerCPU`).
pub const SHARES_PER_CPU: u64 = 1024;
/// The CFS period the kubelet sets (`QuotaPeriod`, 100 ms in µs).
pub const QUOTA_PERIOD: u64 = 100_000;
/// The smallest CFS quota (`MinQuotaPeriod`, 1 ms in µs: the kernel refuses less).
pub const MIN_QUOTA: i64 = 1000;
/// Where cgroup file systems live by convention; v2 when this is a `cgroup2` mount.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// How often the processes left in a cgroup being removed are killed before giving up
/// (`pod_container_manager_linux.go` `tryKillingCgroupProcesses`: 5 attempts).
pub const KILL_ATTEMPTS: u32 = 5;
/// How often an `rmdir` that fails with `EBUSY` (a killed process not yet reaped) is tried
/// (runc's `RemovePaths`: 5 tries, 10 ms doubling).
pub const RMDIR_ATTEMPTS: u32 = 5;
/// The first pause between `rmdir` attempts, doubled each time (runc's `RemovePaths`).
pub const RMDIR_FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The most entries a cgroup tree walk visits while removing (bounds a runaway tree: a pod
/// cgroup holds a sandbox and a few containers).
pub const MAX_WALK: usize = 4096;

/// `MilliCPUToShares`: CPU shares of a CPU request in millicores (2 for none, at most
/// [`MAX_SHARES`]).
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    if milli_cpu <= 0 {
        return MIN_SHARES;
    }
    let shares = (milli_cpu as u128 * u128::from(SHARES_PER_CPU) / 1000) as u64;
    shares.clamp(MIN_SHARES, MAX_SHARES)
}

/// `MilliCPUToQuota`: the CFS quota of a CPU limit in millicores over `period` µs (0: no
/// limit; at least [`MIN_QUOTA`]).
pub fn milli_cpu_to_quota(milli_cpu: i64, period: u64) -> i64 {
    if milli_cpu <= 0 {
        return 0;
    }
    let quota = (milli_cpu as i128 * i128::from(period) / 1000).min(i128::from(i64::MAX)) as i64;
    quota.max(MIN_QUOTA)
}

/// runc's `CpuSharesToCpuWeight` (libcontainer `cgroups/utils.go`, the mapping the kubelet
/// 1.32 uses on v2): shares in [2, 262144] onto `cpu.weight` in [1, 10000]; 0 stays 0 (not
/// set).
pub fn cpu_shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    let shares = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + ((shares - 2) * 9999) / 262_142
}

/// The limits of one cgroup (upstream `ResourceConfig`): `None` leaves a file as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// `cpu.shares` (v1), converted to `cpu.weight` on v2.
    pub cpu_shares: Option<u64>,
    /// CFS quota in µs per period; -1: unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period in µs.
    pub cpu_period: Option<u64>,
    /// Memory limit in bytes; -1: unlimited.
    pub memory: Option<i64>,
    /// Most processes; -1: unlimited.
    pub pids_limit: Option<i64>,
    /// Hugepage limits in bytes by page size as the kernel names it (`2MB`, `1GB`); `None`
    /// leaves them as they are.
    pub hugepage_limits: Option<BTreeMap<String, u64>>,
}

/// Where hugepage pools are listed, one `hugepages-<n>kB` directory per page size.
pub const HUGEPAGES_DIR: &str = "/sys/kernel/mm/hugepages";

/// The hugetlb controller's name (its files' prefix).
pub const HUGETLB: &str = "hugetlb";

/// The page sizes this host supports, as the kernel names them in hugetlb files (`2MB`,
/// `1GB`; libcontainer's `HugePageSizes`), read once.
pub fn hugepage_sizes() -> &'static [String] {
    static SIZES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    SIZES.get_or_init(|| hugepage_sizes_in(Path::new(HUGEPAGES_DIR)))
}

/// The page sizes listed under `dir` (see [`hugepage_sizes`]), smallest first; none when
/// the kernel has no hugepages.
pub fn hugepage_sizes_in(dir: &Path) -> Vec<String> {
    let mut sizes: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let kb = name.strip_prefix("hugepages-")?.strip_suffix("kB")?;
            kb.parse::<u64>().ok()?.checked_mul(1024)
        })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes.into_iter().filter_map(hugepage_unit_size).collect()
}

/// A page size in bytes as the kernel names it (`v1helper.HugePageUnitSizeFromByteSize`:
/// divided by 1024 while it divides, `2MB`, `1GB`); `None` for a size not a whole number of
/// its largest unit.
pub fn hugepage_unit_size(mut size: u64) -> Option<String> {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut idx = 0;
    while size != 0 && size.is_multiple_of(1024) && idx < UNITS.len() - 1 {
        size /= 1024;
        idx += 1;
    }
    if size > 1024 && idx < UNITS.len() - 1 {
        return None;
    }
    Some(format!("{size}{}", UNITS[idx]))
}

/// What a cgroup's files hold, read back (for the kubelet's checks and the tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// `cpu.shares` (v1).
    pub cpu_shares: Option<u64>,
    /// `cpu.weight` (v2).
    pub cpu_weight: Option<u64>,
    /// `cpu.cfs_quota_us` (v1) or the first field of `cpu.max` (v2); -1 for unlimited.
    pub cpu_quota: Option<i64>,
    /// `cpu.cfs_period_us` or the second field of `cpu.max`.
    pub cpu_period: Option<u64>,
    /// `memory.limit_in_bytes` or `memory.max`; -1 for `max`.
    pub memory: Option<i64>,
    /// `pids.max`; -1 for `max`.
    pub pids_limit: Option<i64>,
    /// `hugetlb.<size>.limit_in_bytes` or `hugetlb.<size>.max` by page size; -1 for `max`.
    pub hugepage_limits: BTreeMap<String, i64>,
}

/// A failure on a cgroup file, naming it.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no cgroup file system mounted (read /proc/self/mountinfo)")]
    NotMounted,
    #[error("cgroup {name}: {count} process(es) still in it after {attempts} kills")]
    Busy {
        name: String,
        count: usize,
        attempts: u32,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The cgroup file systems of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// v1 hierarchies by the controllers each carries (`cpu`, `cpu,cpuacct`, `name=systemd`,
    /// and the hybrid layout's unified mount under the key `""`).
    V1(BTreeMap<String, PathBuf>),
    /// The unified hierarchy's mount point.
    V2(PathBuf),
}

/// Creates, updates, reads and removes cgroups by name (an absolute path such as
/// `/kubepods/burstable/pod<uid>`) on one [`Layout`].
#[derive(Clone, Debug)]
pub struct CgroupManager {
    layout: Layout,
}

impl CgroupManager {
    /// The manager of this host's cgroups (`/proc/self/mountinfo`).
    pub fn detect() -> Result<CgroupManager, CgroupError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        Self::from_mountinfo(&text)
    }

    /// The manager of the cgroup mounts in a `mountinfo` text: v2 when `/sys/fs/cgroup` is a
    /// `cgroup2` mount, else every `cgroup` (v1) mount plus a `cgroup2` one beside them.
    pub fn from_mountinfo(text: &str) -> Result<CgroupManager, CgroupError> {
        let mut v1 = BTreeMap::new();
        let mut unified = None;
        for line in text.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let fields: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            let (Some(fstype), Some(_source), Some(options)) =
                (post.next(), post.next(), post.next())
            else {
                continue;
            };
            let Some(mount_point) = fields.get(4).map(|m| unescape_mount(m)) else {
                continue;
            };
            match fstype {
                "cgroup2" => {
                    if mount_point == Path::new(CGROUP_MOUNT) {
                        return Ok(CgroupManager::v2(mount_point));
                    }
                    unified.get_or_insert(mount_point);
                }
                "cgroup" => {
                    let controllers: Vec<&str> = options
                        .split(',')
                        .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains("clone_children"))
                        .collect();
                    if !controllers.is_empty() {
                        v1.insert(controllers.join(","), mount_point);
                    }
                }
                _ => {}
            }
        }
        if v1.is_empty() {
            return match unified {
                Some(root) => Ok(CgroupManager::v2(root)),
                None => Err(CgroupError::NotMounted),
            };
        }
        if let Some(root) = unified {
            v1.insert(String::new(), root);
        }
        Ok(CgroupManager {
            layout: Layout::V1(v1),
        })
    }

    /// A manager of a v2 tree mounted at `root`.
    pub fn v2(root: PathBuf) -> CgroupManager {
        CgroupManager {
            layout: Layout::V2(root),
        }
    }

    /// A manager of v1 hierarchies (controllers, mount point).
    pub fn v1(hierarchies: impl IntoIterator<Item = (String, PathBuf)>) -> CgroupManager {
        CgroupManager {
            layout: Layout::V1(hierarchies.into_iter().collect()),
        }
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Whether the host is on the unified hierarchy.
    pub fn is_v2(&self) -> bool {
        matches!(self.layout, Layout::V2(_))
    }

    /// The directory of `name` in the hierarchy of `controller` (v1), or in the tree (v2).
    pub fn path(&self, controller: &str, name: &str) -> Option<PathBuf> {
        let rel = name.trim_start_matches('/');
        match &self.layout {
            Layout::V2(root) => Some(root.join(rel)),
            Layout::V1(h) => h
                .iter()
                .find(|(k, _)| k.split(',').any(|c| c == controller))
                .map(|(_, mount)| mount.join(rel)),
        }
    }

    /// The directory of `name` in the hugetlb hierarchy and whether that is a v2 one (the
    /// unified tree, or a hybrid host's unified mount when its `cgroup.controllers` lists
    /// hugetlb and no v1 hierarchy carries it).
    pub fn hugetlb_path(&self, name: &str) -> Option<(PathBuf, bool)> {
        if let Layout::V1(h) = &self.layout {
            if let Some(dir) = self.path(HUGETLB, name) {
                return Some((dir, false));
            }
            let unified = h.get("")?;
            let controllers =
                std::fs::read_to_string(unified.join("cgroup.controllers")).unwrap_or_default();
            return controllers
                .split_whitespace()
                .any(|c| c == HUGETLB)
                .then(|| (unified.join(name.trim_start_matches('/')), true));
        }
        self.path(HUGETLB, name).map(|dir| (dir, true))
    }

    /// Every directory `name` has (one per v1 hierarchy, one on v2).
    pub fn dirs(&self, name: &str) -> Vec<PathBuf> {
        let rel = name.trim_start_matches('/');
        match &self.layout {
            Layout::V2(root) => vec![root.join(rel)],
            Layout::V1(h) => h.values().map(|m| m.join(rel)).collect(),
        }
    }

    /// Whether `name` exists (in every hierarchy on v1, as upstream's `Exists`).
    pub fn exists(&self, name: &str) -> bool {
        self.dirs(name).iter().all(|d| d.is_dir())
    }

    /// Creates `name` (and its missing ancestors) and sets `config` (upstream `Create`).
    pub fn create(&self, name: &str, config: &ResourceConfig) -> Result<(), CgroupError> {
        match &self.layout {
            Layout::V2(root) => create_unified(root, name)?,
            Layout::V1(h) => {
                for (controllers, mount) in h {
                    let dir = mount.join(name.trim_start_matches('/'));
                    if controllers.is_empty() {
                        // The hybrid layout's unified mount: its controllers (hugetlb here)
                        // reach a child only when every ancestor enables them, as on v2.
                        create_unified(mount, name)?;
                        continue;
                    }
                    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
                    if controllers.split(',').any(|c| c == "cpuset") {
                        init_cpuset(mount, &dir)?;
                    }
                }
            }
        }
        self.update(name, config)
    }

    /// Sets `config` on an existing `name` (upstream `Update`).
    pub fn update(&self, name: &str, config: &ResourceConfig) -> Result<(), CgroupError> {
        match &self.layout {
            Layout::V1(_) => {
                let cpu = self.path("cpu", name);
                if let Some(dir) = &cpu {
                    if let Some(shares) = config.cpu_shares.filter(|s| *s != 0) {
                        write(dir, "cpu.shares", &shares.to_string())?;
                    }
                    if let Some(period) = config.cpu_period.filter(|p| *p != 0) {
                        write(dir, "cpu.cfs_period_us", &period.to_string())?;
                    }
                    if let Some(quota) = config.cpu_quota.filter(|q| *q != 0) {
                        write(dir, "cpu.cfs_quota_us", &quota.to_string())?;
                    }
                }
                if let (Some(dir), Some(memory)) =
                    (self.path("memory", name), config.memory.filter(|m| *m != 0))
                {
                    write(&dir, "memory.limit_in_bytes", &memory.to_string())?;
                }
                if let (Some(dir), Some(pids)) = (self.path("pids", name), config.pids_limit) {
                    write(&dir, "pids.max", &max_or(pids))?;
                }
            }
            Layout::V2(root) => {
                let dir = root.join(name.trim_start_matches('/'));
                if let Some(shares) = config.cpu_shares.filter(|s| *s != 0) {
                    write(
                        &dir,
                        "cpu.weight",
                        &cpu_shares_to_weight(shares).to_string(),
                    )?;
                }
                let quota = config.cpu_quota.filter(|q| *q != 0);
                let period = config.cpu_period.filter(|p| *p != 0);
                if quota.is_some() || period.is_some() {
                    // runc's `fs2.setCpu`: the quota or `max`, then the period if given.
                    let mut max = quota.map_or("max".to_string(), max_or);
                    if let Some(p) = period {
                        max = format!("{max} {p}");
                    }
                    write(&dir, "cpu.max", &max)?;
                }
                if let Some(memory) = config.memory.filter(|m| *m != 0) {
                    write(&dir, "memory.max", &max_or(memory))?;
                }
                if let Some(pids) = config.pids_limit {
                    write(&dir, "pids.max", &max_or(pids))?;
                }
            }
        }
        // runc's `fs.HugetlbGroup.Set` / `fs2.setHugeTlb` (v2 also takes a reservation
        // limit, `hugetlb.<size>.rsvd.max`, which the kubelet 1.32 does not set).
        if let (Some(limits), Some((dir, v2))) =
            (config.hugepage_limits.as_ref(), self.hugetlb_path(name))
        {
            for (size, limit) in limits {
                let file = if v2 {
                    format!("hugetlb.{size}.max")
                } else {
                    format!("hugetlb.{size}.limit_in_bytes")
                };
                write(&dir, &file, &limit.to_string())?;
            }
        }
        Ok(())
    }

    /// Reads back what `name`'s files hold.
    pub fn read(&self, name: &str) -> Result<Observed, CgroupError> {
        let mut o = Observed::default();
        match &self.layout {
            Layout::V1(_) => {
                if let Some(dir) = self.path("cpu", name) {
                    o.cpu_shares = read_num(&dir, "cpu.shares")?;
                    o.cpu_quota = read_num(&dir, "cpu.cfs_quota_us")?;
                    o.cpu_period = read_num(&dir, "cpu.cfs_period_us")?;
                }
                if let Some(dir) = self.path("memory", name) {
                    o.memory = read_num(&dir, "memory.limit_in_bytes")?;
                }
                if let Some(dir) = self.path("pids", name) {
                    o.pids_limit = read_num(&dir, "pids.max")?;
                }
            }
            Layout::V2(root) => {
                let dir = root.join(name.trim_start_matches('/'));
                o.cpu_weight = read_num(&dir, "cpu.weight")?;
                if let Some(max) = read_text(&dir, "cpu.max")? {
                    let mut f = max.split_whitespace();
                    o.cpu_quota = f.next().and_then(parse_max);
                    o.cpu_period = f.next().and_then(|p| p.parse().ok());
                }
                o.memory = read_num(&dir, "memory.max")?;
                o.pids_limit = read_num(&dir, "pids.max")?;
            }
        }
        if let Some((dir, v2)) = self.hugetlb_path(name) {
            for size in hugepage_sizes() {
                let file = if v2 {
                    format!("hugetlb.{size}.max")
                } else {
                    format!("hugetlb.{size}.limit_in_bytes")
                };
                if let Some(v) = read_num::<i64>(&dir, &file)? {
                    o.hugepage_limits.insert(size.clone(), v);
                }
            }
        }
        Ok(o)
    }

    /// The processes in `name` and below it (upstream `Pids`: every hierarchy's tree).
    pub fn pids(&self, name: &str) -> Vec<i32> {
        let mut pids = Vec::new();
        for dir in self.dirs(name) {
            for d in walk(&dir) {
                let text = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Removes `name` and what runc left below it (upstream `Destroy` after
    /// `tryKillingCgroupProcesses`): the processes still there are killed (`cgroup.kill` on
    /// v2 when the kernel has it, SIGKILL to each otherwise) up to [`KILL_ATTEMPTS`] times,
    /// then each directory is removed deepest first, retried while the kernel says busy.
    pub async fn destroy(&self, name: &str) -> Result<(), CgroupError> {
        let mut attempts = 0;
        loop {
            let pids = self.pids(name);
            if pids.is_empty() {
                break;
            }
            if attempts == KILL_ATTEMPTS {
                return Err(CgroupError::Busy {
                    name: name.to_string(),
                    count: pids.len(),
                    attempts,
                });
            }
            attempts += 1;
            if let Layout::V2(root) = &self.layout {
                let kill = root.join(name.trim_start_matches('/')).join("cgroup.kill");
                if kill.exists() {
                    let _ = std::fs::write(&kill, "1");
                }
            }
            for pid in pids {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            tokio::time::sleep(RMDIR_FIRST_PAUSE).await;
        }
        for dir in self.dirs(name) {
            let mut tree = walk(&dir);
            // Deepest first: a cgroup goes only once it has no children.
            tree.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for d in tree {
                remove_dir(&d).await?;
            }
        }
        Ok(())
    }
}

/// `rmdir` of a cgroup, retried while busy; gone already is fine.
async fn remove_dir(dir: &Path) -> Result<(), CgroupError> {
    let mut pause = RMDIR_FIRST_PAUSE;
    for attempt in 1..=RMDIR_ATTEMPTS {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if attempt == RMDIR_ATTEMPTS => return Err(io(dir)(e)),
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
    }
    Ok(())
}

/// `dir` and every directory below it, bounded by [`MAX_WALK`]; nothing when it is gone.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if !dir.is_dir() {
        return out;
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if out.len() >= MAX_WALK {
            break;
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        out.push(d);
    }
    out
}

/// Creates `name` under a cgroup2 mount `root`, each ancestor first enabling its
/// controllers for its children, down to the parent.
fn create_unified(root: &Path, name: &str) -> Result<(), CgroupError> {
    let rel = Path::new(name.trim_start_matches('/'));
    let mut dir = root.to_path_buf();
    for part in rel.components() {
        enable_controllers(&dir)?;
        dir.push(part);
        if !dir.is_dir() {
            std::fs::create_dir(&dir)
                .or_else(|e| {
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .map_err(io(&dir))?;
        }
    }
    Ok(())
}

/// The v2 controllers the kubelet's limits need; the others are enabled when the kernel
/// lets them be.
const REQUIRED_V2: &[&str] = &["cpu", "memory", "pids"];

/// v2: lets `dir`'s children use every controller `dir` has (`cgroup.controllers` into
/// `cgroup.subtree_control`, one write). Should the kernel refuse one of them (a controller
/// that cannot be enabled there), the required ones ([`REQUIRED_V2`]) are enabled one by
/// one, and only their failure is an error. A directory without the file (not a cgroup, or
/// a leaf) is left alone.
fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let Ok(available) = std::fs::read_to_string(dir.join("cgroup.controllers")) else {
        return Ok(());
    };
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    let missing: Vec<String> = available
        .split_whitespace()
        .filter(|c| !enabled.split_whitespace().any(|e| e == *c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() || write(dir, "cgroup.subtree_control", &missing.join(" ")).is_ok() {
        return Ok(());
    }
    for c in missing
        .iter()
        .filter(|c| REQUIRED_V2.contains(&c.trim_start_matches('+')))
    {
        write(dir, "cgroup.subtree_control", c)?;
    }
    Ok(())
}

/// v1 `cpuset`: a new cgroup has no CPUs or memory nodes until given its parent's (runc's
/// `cpuset.ensureParent`); each level from the hierarchy's root down gets them if empty.
fn init_cpuset(mount: &Path, dir: &Path) -> Result<(), CgroupError> {
    let Ok(rel) = dir.strip_prefix(mount) else {
        return Ok(());
    };
    let mut parent = mount.to_path_buf();
    for part in rel.components() {
        let child = parent.join(part);
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let current = std::fs::read_to_string(child.join(file)).unwrap_or_default();
            if current.trim().is_empty() {
                let from = std::fs::read_to_string(parent.join(file)).unwrap_or_default();
                if !from.trim().is_empty() {
                    write(&child, file, from.trim())?;
                }
            }
        }
        parent = child;
    }
    Ok(())
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    std::fs::write(&path, value).map_err(io(&path))
}

fn read_text(dir: &Path, file: &str) -> Result<Option<String>, CgroupError> {
    let path = dir.join(file);
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(Some(t.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&path)(e)),
    }
}

fn read_num<T: std::str::FromStr + TryFrom<i64>>(
    dir: &Path,
    file: &str,
) -> Result<Option<T>, CgroupError> {
    Ok(read_text(dir, file)?.and_then(|t| {
        if t == "max" {
            T::try_from(-1).ok()
        } else {
            t.parse().ok()
        }
    }))
}

fn parse_max(t: &str) -> Option<i64> {
    if t == "max" { Some(-1) } else { t.parse().ok() }
}

/// `max` for an unlimited (negative) value, else the number.
fn max_or(v: i64) -> String {
    if v < 0 {
        "max".to_string()
    } else {
        v.to_string()
    }
}

/// A mount point as `mountinfo` escapes it (`\040` for a space, octal).
fn unescape_mount(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(v) = bytes
                .get(i + 1..i + 4)
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    use std::os::unix::ffi::OsStringExt as _;
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests;
