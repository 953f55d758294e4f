//! The machine the node runs on, read from the host as the upstream kubelet reads it through
//! cAdvisor (`cadvisor/machine`, `pkg/kubelet/cadvisor/util.go` `CapacityFromMachineInfo`):
//! capacity (cpu, memory, hugepages, pods, ephemeral-storage), the node's identity (boot id,
//! machine id, system UUID, kernel, OS image, architecture), and allocatable as the kubelet's
//! container manager computes it (`pkg/kubelet/cm/node_container_manager_linux.go`,
//! `GetNodeAllocatableReservation`, `hardEvictionReservation`): capacity minus
//! `--kube-reserved`, `--system-reserved` and the hard eviction thresholds, never below zero,
//! and memory minus every hugepage pool (`pkg/kubelet/nodestatus/setters.go`, `MachineInfo`).
//!
//! The trick carried here: every quantity is an exact integer of nano-units
//! ([`Quantity`], shared with the apiserver's validation), so `cpu: 2` minus `100m` is exactly
//! `1900m` and memory stays in whole bytes; the written form is Kubernetes' canonical one
//! (`24683568Ki`, `1900m`), so an unchanged machine produces byte-identical status and the
//! status loop can compare what it would post with what is stored.
//!
//! Every path is under a [`HostPaths`] so tests can point the reader at a fake `/proc`,
//! `/sys` and `/etc`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use skerry_api::validation::quantity::{QUANTITY_FORMAT_ERROR, Quantity};

/// The kubelet's `--max-pods` default (`pkg/kubelet/apis/config/v1beta1/defaults.go`,
/// `MaxPods`): 110 pods a node, the number the scheduler's pod-count filter assumes.
pub const MAX_PODS_DEFAULT: u32 = 110;

/// Resource names (`k8s.io/api/core/v1` `ResourceName` constants).
pub mod resources {
    /// CPUs, in cores (`2`, `1900m`).
    pub const CPU: &str = "cpu";
    /// Memory, in bytes.
    pub const MEMORY: &str = "memory";
    /// Pods the node may run.
    pub const PODS: &str = "pods";
    /// Local storage for pods' writable layers, logs and emptyDirs, in bytes.
    pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
    /// Process ids: reservable with `--kube-reserved pid=...`, never a node capacity.
    pub const PID: &str = "pid";
    /// The prefix of a hugepage pool's resource (`hugepages-2Mi`).
    pub const HUGEPAGES_PREFIX: &str = "hugepages-";
}

/// Nano-units per unit: [`Quantity`]'s scale.
pub const NANO: i128 = 1_000_000_000;

/// Where the host's facts are read from.
#[derive(Debug, Clone)]
pub struct HostPaths {
    /// `/proc`.
    pub proc: PathBuf,
    /// `/sys`.
    pub sys: PathBuf,
    /// `/etc`.
    pub etc: PathBuf,
    /// `/usr/lib`, where `os-release` lives when `/etc/os-release` does not.
    pub usr_lib: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
            etc: PathBuf::from("/etc"),
            usr_lib: PathBuf::from("/usr/lib"),
        }
    }
}

/// A hugepage pool: pages of one size and how many are reserved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HugePages {
    /// The page size in bytes (2 MiB, 1 GiB...).
    pub page_size: u64,
    /// `nr_hugepages` of the pool.
    pub count: u64,
}

impl HugePages {
    /// The pool's resource name: `hugepages-` and the page size as a binary quantity
    /// (`hugepages-2Mi`, `hugepages-1Gi`), as `v1helper.HugePageResourceName` names it.
    pub fn resource_name(&self) -> String {
        format!(
            "{}{}",
            resources::HUGEPAGES_PREFIX,
            format_binary(i128::from(self.page_size))
        )
    }
}

/// What the host is: cAdvisor's `MachineInfo` and `VersionInfo`, the parts the node status
/// reports.
#[derive(Debug, Clone)]
pub struct MachineInfo {
    /// CPUs this process may run on (its affinity mask: cgroup cpusets and `taskset`
    /// included), as Go's `runtime.NumCPU` and cAdvisor count them.
    pub num_cpus: u32,
    /// `MemTotal` of `/proc/meminfo`, in bytes.
    pub memory_capacity: u64,
    /// The hugepage pools of `/sys/kernel/mm/hugepages`, by page size.
    pub hugepages: Vec<HugePages>,
    /// The size of the filesystem holding the kubelet's root dir, in bytes.
    pub ephemeral_storage: u64,
    /// `uname -r`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of `os-release` (`Debian GNU/Linux 12 (bookworm)`).
    pub os_image: String,
    /// `/proc/sys/kernel/random/boot_id`: changes at every boot.
    pub boot_id: String,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// `/sys/class/dmi/id/product_uuid` where readable (root only on most boards), else
    /// empty, as cAdvisor leaves it.
    pub system_uuid: String,
    /// Go's `GOARCH` name of this build (`amd64`, `arm64`...): what images are built for.
    pub architecture: &'static str,
    /// Go's `GOOS` name (`linux`).
    pub operating_system: &'static str,
}

/// A host fact that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A file could not be read.
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file did not say what it should.
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A system call failed.
    #[error("{call}: {source}")]
    Syscall {
        call: &'static str,
        source: std::io::Error,
    },
}

fn read(path: &Path) -> Result<String, MachineError> {
    std::fs::read_to_string(path).map_err(|source| MachineError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl MachineInfo {
    /// Reads the host through `paths`; `root_dir` is the kubelet's root dir, whose filesystem
    /// is the node's ephemeral storage.
    pub fn read(paths: &HostPaths, root_dir: &Path) -> Result<MachineInfo, MachineError> {
        let meminfo_path = paths.proc.join("meminfo");
        let memory_capacity =
            meminfo_field(&read(&meminfo_path)?, "MemTotal").ok_or_else(|| {
                MachineError::Parse {
                    path: meminfo_path.clone(),
                    message: "no MemTotal line".into(),
                }
            })?;
        let uname = rustix::system::uname();
        Ok(MachineInfo {
            num_cpus: num_cpus(paths)?,
            memory_capacity,
            hugepages: hugepages(&paths.sys.join("kernel/mm/hugepages"))?,
            ephemeral_storage: filesystem_size(root_dir)?,
            kernel_version: uname.release().to_string_lossy().into_owned(),
            os_image: os_image(paths),
            boot_id: read(&paths.proc.join("sys/kernel/random/boot_id"))?
                .trim()
                .to_string(),
            machine_id: read(&paths.etc.join("machine-id"))?.trim().to_string(),
            system_uuid: std::fs::read_to_string(paths.sys.join("class/dmi/id/product_uuid"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            architecture: go_arch(),
            operating_system: go_os(),
        })
    }

    /// The node's capacity (cAdvisor's `CapacityFromMachineInfo` plus `pods` and
    /// `ephemeral-storage`): `max_pods` is `--max-pods`.
    pub fn capacity(&self, max_pods: u32) -> ResourceList {
        let mut capacity = ResourceList::new();
        capacity.insert(
            resources::CPU.into(),
            Quantity(i128::from(self.num_cpus) * NANO),
        );
        capacity.insert(
            resources::MEMORY.into(),
            Quantity(i128::from(self.memory_capacity) * NANO),
        );
        capacity.insert(
            resources::PODS.into(),
            Quantity(i128::from(max_pods) * NANO),
        );
        capacity.insert(
            resources::EPHEMERAL_STORAGE.into(),
            Quantity(i128::from(self.ephemeral_storage) * NANO),
        );
        for pool in &self.hugepages {
            let bytes = i128::from(pool.page_size) * i128::from(pool.count);
            capacity.insert(pool.resource_name(), Quantity(bytes * NANO));
        }
        capacity
    }
}

/// The CPUs in this process's affinity mask; the online CPUs of `/sys` if the mask cannot be
/// read.
fn num_cpus(paths: &HostPaths) -> Result<u32, MachineError> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) if set.count() > 0 => Ok(set.count()),
        _ => {
            let path = paths.sys.join("devices/system/cpu/online");
            let text = read(&path)?;
            cpu_list_len(text.trim()).ok_or_else(|| MachineError::Parse {
                path,
                message: format!("{:?} is not a CPU list", text.trim()),
            })
        }
    }
}

/// The number of CPUs in a kernel CPU list (`0-3,8,10-11`).
pub fn cpu_list_len(list: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
            }
            None => {
                part.parse::<u32>().ok()?;
                n = n.checked_add(1)?;
            }
        }
    }
    Some(n)
}

/// A `kB` field of `/proc/meminfo`, in bytes.
pub fn meminfo_field(meminfo: &str, field: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let (name, rest) = line.split_once(':')?;
        if name != field {
            return None;
        }
        let mut words = rest.split_whitespace();
        let value: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

/// The hugepage pools under `dir` (`hugepages-2048kB/nr_hugepages`...), by page size. A
/// kernel without hugepages has no such dir: no pools. The machine's pools are under
/// `/sys/kernel/mm/hugepages`, a NUMA node's under `/sys/devices/system/node/node<N>/hugepages`.
pub fn hugepages(dir: &Path) -> Result<Vec<HugePages>, MachineError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(MachineError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut pools = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| MachineError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(kb) = name
            .strip_prefix("hugepages-")
            .and_then(|s| s.strip_suffix("kB"))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        let count_path = entry.path().join("nr_hugepages");
        let text = read(&count_path)?;
        let count = text.trim().parse().map_err(|_| MachineError::Parse {
            path: count_path,
            message: format!("{:?} is not a page count", text.trim()),
        })?;
        pools.push(HugePages {
            page_size: kb.saturating_mul(1024),
            count,
        });
    }
    pools.sort_by_key(|p| p.page_size);
    Ok(pools)
}

/// The size of the filesystem holding `dir`: blocks times the fragment size, as `df` counts.
fn filesystem_size(dir: &Path) -> Result<u64, MachineError> {
    let st = rustix::fs::statvfs(dir).map_err(|e| MachineError::Syscall {
        call: "statvfs",
        source: e.into(),
    })?;
    Ok(st.f_blocks.saturating_mul(st.f_frsize))
}

/// What is free on the filesystem holding `dir`: bytes available to unprivileged users and
/// free inodes, with the totals.
#[derive(Debug, Clone, Copy)]
pub struct FsStats {
    /// Total bytes.
    pub capacity: u64,
    /// Bytes an unprivileged writer may still use.
    pub available: u64,
    /// Total inodes.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
}

/// [`FsStats`] of the filesystem holding `dir`.
pub fn fs_stats(dir: &Path) -> Result<FsStats, MachineError> {
    let st = rustix::fs::statvfs(dir).map_err(|e| MachineError::Syscall {
        call: "statvfs",
        source: e.into(),
    })?;
    Ok(FsStats {
        capacity: st.f_blocks.saturating_mul(st.f_frsize),
        available: st.f_bavail.saturating_mul(st.f_frsize),
        inodes: st.f_files,
        inodes_free: st.f_ffree,
    })
}

/// `PRETTY_NAME` of `/etc/os-release` (or `/usr/lib/os-release`); `Linux` when neither says,
/// as cAdvisor's `getContainerOsVersion` falls back.
fn os_image(paths: &HostPaths) -> String {
    [
        paths.etc.join("os-release"),
        paths.usr_lib.join("os-release"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|text| os_release_field(&text, "PRETTY_NAME"))
    .unwrap_or_else(|| "Linux".to_string())
}

/// A field of an `os-release` file, unquoted (`os-release(5)`: a value may be in single or
/// double quotes, with `\"`, `\\`, `\$` and `` \` `` escaped inside).
pub fn os_release_field(text: &str, field: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (name, value) = line.trim().split_once('=')?;
        if name != field {
            return None;
        }
        let value = value.trim();
        let unquoted = if let Some(inner) =
            value.strip_prefix('"').and_then(|v| v.strip_suffix('"'))
        {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    if let Some(next) = chars.next() {
                        out.push(next);
                    }
                } else {
                    out.push(c);
                }
            }
            out
        } else if let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
            inner.to_string()
        } else {
            value.to_string()
        };
        Some(unquoted)
    })
}

/// Go's `GOARCH` for this build's target: the name images' platforms and the
/// `kubernetes.io/arch` label use.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "arm" => "arm",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        "mips64" => "mips64",
        other => other,
    }
}

/// Go's `GOOS` for this build's target (`linux`).
pub fn go_os() -> &'static str {
    std::env::consts::OS
}

/// Resources by name, as exact quantities.
pub type ResourceList = BTreeMap<String, Quantity>;

/// A resource list as the API writes it, each quantity in Kubernetes' canonical form.
pub fn to_api(list: &ResourceList) -> BTreeMap<String, ApiQuantity> {
    list.iter()
        .map(|(name, q)| (name.clone(), ApiQuantity(format_quantity(name, *q))))
        .collect()
}

/// Whether `name` is counted in bytes (written with binary suffixes, `Ki`, `Mi`...).
fn is_bytes(name: &str) -> bool {
    name == resources::MEMORY
        || name == resources::EPHEMERAL_STORAGE
        || name.starts_with(resources::HUGEPAGES_PREFIX)
}

/// `q` in Kubernetes' canonical form for the resource `name`: bytes with the largest binary
/// suffix that divides them exactly (`24683568Ki`, `0`), other resources in decimal with the
/// smallest of no suffix, `m` or `n` that keeps them exact (`2`, `1900m`), as
/// apimachinery's `Quantity.String` writes `BinarySI` and `DecimalSI` values.
pub fn format_quantity(name: &str, q: Quantity) -> String {
    if is_bytes(name) && q.0 % NANO == 0 {
        return format_binary(q.0 / NANO);
    }
    format_decimal(q.0)
}

/// A whole number of bytes in canonical binary form.
fn format_binary(bytes: i128) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".into();
    }
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if value % 1024 != 0 {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    format!("{value}{suffix}")
}

/// Nano-units in canonical decimal form.
fn format_decimal(nano: i128) -> String {
    if nano % NANO == 0 {
        format!("{}", nano / NANO)
    } else if nano % 1_000_000 == 0 {
        format!("{}m", nano / 1_000_000)
    } else if nano % 1_000 == 0 {
        format!("{}u", nano / 1_000)
    } else {
        format!("{nano}n")
    }
}

/// A bad `--kube-reserved`, `--system-reserved` or `--eviction-hard` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

/// Splits a `key=value,key=value` flag as the kubelet's `cliflag.MapStringString` does:
/// pairs split on `,`, each on its first `=`, keys and values trimmed; an empty string is an
/// empty map.
pub fn parse_map_flag(text: &str, separator: char) -> Result<Vec<(String, String)>, FlagError> {
    let mut pairs = Vec::new();
    for pair in text.split(',') {
        if pair.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = pair.split_once(separator) else {
            return Err(FlagError(format!(
                "malformed pair, expect string{separator}string"
            )));
        };
        pairs.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(pairs)
}

/// Parses `--kube-reserved` / `--system-reserved` (`cpu=100m,memory=256Mi,
/// ephemeral-storage=1Gi,pid=1000`): only those four resources may be reserved, each a
/// non-negative quantity (the kubelet's `parseResourceList`, with its messages).
pub fn parse_reserved(text: &str) -> Result<ResourceList, FlagError> {
    let mut list = ResourceList::new();
    for (name, value) in parse_map_flag(text, '=')? {
        match name.as_str() {
            resources::CPU | resources::MEMORY | resources::EPHEMERAL_STORAGE | resources::PID => {
                let q = Quantity::parse(&value).ok_or_else(|| {
                    FlagError(format!(
                        "failed to parse quantity {value:?} for {name:?} resource: {QUANTITY_FORMAT_ERROR}"
                    ))
                })?;
                if q.is_negative() {
                    return Err(FlagError(format!(
                        "resource quantity for {name:?} cannot be negative: {value}"
                    )));
                }
                list.insert(name, q);
            }
            _ => return Err(FlagError(format!("cannot reserve {name:?} resource"))),
        }
    }
    Ok(list)
}

/// An eviction signal's threshold: an absolute quantity or a share of the capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThresholdValue {
    /// `memory.available<100Mi`.
    Quantity(Quantity),
    /// `nodefs.available<10%`: parts per million of the capacity, so `7.5%` stays exact.
    PercentageMillionths(u32),
}

impl ThresholdValue {
    /// The threshold against `capacity` (apimachinery's `GetThresholdQuantity`).
    pub fn against(&self, capacity: Quantity) -> Quantity {
        match *self {
            ThresholdValue::Quantity(q) => q,
            ThresholdValue::PercentageMillionths(ppm) => {
                // Whole units first, as the kubelet takes `capacity.Value()` before scaling.
                let units = capacity.0.div_euclid(NANO);
                Quantity(units * i128::from(ppm) / 1_000_000 * NANO)
            }
        }
    }
}

/// The eviction signals the kubelet knows (`pkg/kubelet/eviction/api/types.go`).
pub mod signals {
    /// Memory not in use by anything that cannot be reclaimed.
    pub const MEMORY_AVAILABLE: &str = "memory.available";
    /// Free bytes on the kubelet's root filesystem.
    pub const NODEFS_AVAILABLE: &str = "nodefs.available";
    /// Free inodes on the kubelet's root filesystem.
    pub const NODEFS_INODES_FREE: &str = "nodefs.inodesFree";
    /// Free bytes on the runtime's image filesystem.
    pub const IMAGEFS_AVAILABLE: &str = "imagefs.available";
    /// Free inodes on the runtime's image filesystem.
    pub const IMAGEFS_INODES_FREE: &str = "imagefs.inodesFree";
    /// Free bytes on the runtime's container filesystem.
    pub const CONTAINERFS_AVAILABLE: &str = "containerfs.available";
    /// Free inodes on the runtime's container filesystem.
    pub const CONTAINERFS_INODES_FREE: &str = "containerfs.inodesFree";
    /// Free process ids.
    pub const PID_AVAILABLE: &str = "pid.available";
    /// Memory available to the pods' cgroup.
    pub const ALLOCATABLE_MEMORY_AVAILABLE: &str = "allocatableMemory.available";
    /// Every signal.
    pub const ALL: &[&str] = &[
        MEMORY_AVAILABLE,
        NODEFS_AVAILABLE,
        NODEFS_INODES_FREE,
        IMAGEFS_AVAILABLE,
        IMAGEFS_INODES_FREE,
        CONTAINERFS_AVAILABLE,
        CONTAINERFS_INODES_FREE,
        PID_AVAILABLE,
        ALLOCATABLE_MEMORY_AVAILABLE,
    ];
}

/// The kubelet's `--eviction-hard` default (`pkg/kubelet/apis/config/v1beta1/defaults_linux.go`,
/// `DefaultEvictionHard`): 100 MiB of memory (what the kernel needs to keep reclaiming), 10 %
/// of the root filesystem and 5 % of its inodes, 15 % of the image filesystem.
pub const EVICTION_HARD_DEFAULT: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%";

/// Hard eviction thresholds by signal.
pub type Thresholds = BTreeMap<String, ThresholdValue>;

/// Parses `--eviction-hard` (`memory.available<100Mi,nodefs.available<10%`), as the
/// kubelet's `ParseThresholdConfig` does: known signals only, a percentage in [0%, 100%], a
/// quantity never negative, `memory.available` never a bare number of bytes below zero.
pub fn parse_eviction_thresholds(text: &str) -> Result<Thresholds, FlagError> {
    let mut thresholds = Thresholds::new();
    for (signal, value) in parse_map_flag(text, '<')? {
        if !signals::ALL.contains(&signal.as_str()) {
            return Err(FlagError(format!("unsupported eviction signal {signal}")));
        }
        let parsed = if let Some(percent) = value.strip_suffix('%') {
            let ppm = parse_percentage_ppm(percent).ok_or_else(|| {
                FlagError(format!(
                    "eviction percentage threshold {signal} must be >= 0% and <= 100%: {value}"
                ))
            })?;
            ThresholdValue::PercentageMillionths(ppm)
        } else {
            let q = Quantity::parse(&value).ok_or_else(|| {
                FlagError(format!(
                    "failed to parse quantity {value:?} for eviction signal {signal}: {QUANTITY_FORMAT_ERROR}"
                ))
            })?;
            if q.is_negative() {
                return Err(FlagError(format!(
                    "eviction threshold {signal} must be positive: {value}"
                )));
            }
            ThresholdValue::Quantity(q)
        };
        thresholds.insert(signal, parsed);
    }
    Ok(thresholds)
}

/// `7.5` as 75,000 parts per million; `None` outside [0, 100] or with more than four
/// decimals.
fn parse_percentage_ppm(text: &str) -> Option<u32> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && fraction.is_empty()
        || fraction.len() > 4
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u32 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut frac: u32 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    for _ in fraction.len()..4 {
        frac *= 10;
    }
    let ppm = whole.checked_mul(10_000)?.checked_add(frac)?;
    (ppm <= 1_000_000).then_some(ppm)
}

/// What is held back from pods: the three reservations the kubelet subtracts.
#[derive(Debug, Clone, Default)]
pub struct Reservations {
    /// `--kube-reserved`: for the kubelet and the runtime.
    pub kube_reserved: ResourceList,
    /// `--system-reserved`: for the OS's own daemons.
    pub system_reserved: ResourceList,
    /// `--eviction-hard`: what the eviction manager keeps free.
    pub eviction_hard: Thresholds,
}

impl Reservations {
    /// The reservations of the three flags' texts, each error naming its flag.
    pub fn parse(
        kube_reserved: &str,
        system_reserved: &str,
        eviction_hard: &str,
    ) -> Result<Reservations, FlagError> {
        let named = |flag: &str, e: FlagError| FlagError(format!("--{flag}: {}", e.0));
        Ok(Reservations {
            kube_reserved: parse_reserved(kube_reserved).map_err(|e| named("kube-reserved", e))?,
            system_reserved: parse_reserved(system_reserved)
                .map_err(|e| named("system-reserved", e))?,
            eviction_hard: parse_eviction_thresholds(eviction_hard)
                .map_err(|e| named("eviction-hard", e))?,
        })
    }

    /// What is reserved of each resource of `capacity` (`GetNodeAllocatableReservation`):
    /// system + kube reserved + the hard eviction threshold of `memory.available` (memory)
    /// and `nodefs.available` (ephemeral-storage); zero reservations are left out.
    pub fn reservation(&self, capacity: &ResourceList) -> ResourceList {
        let mut eviction = ResourceList::new();
        for (signal, resource) in [
            (signals::MEMORY_AVAILABLE, resources::MEMORY),
            (signals::NODEFS_AVAILABLE, resources::EPHEMERAL_STORAGE),
        ] {
            if let Some(threshold) = self.eviction_hard.get(signal) {
                let cap = capacity.get(resource).copied().unwrap_or(Quantity(0));
                eviction.insert(resource.to_string(), threshold.against(cap));
            }
        }
        let mut reserved = ResourceList::new();
        for name in capacity.keys() {
            let total: i128 = [&self.system_reserved, &self.kube_reserved, &eviction]
                .iter()
                .filter_map(|list| list.get(name))
                .map(|q| q.0)
                .sum();
            if total != 0 {
                reserved.insert(name.clone(), Quantity(total));
            }
        }
        reserved
    }

    /// Allocatable of `capacity` (the `MachineInfo` setter): each resource minus its
    /// reservation, never below zero; then memory minus every hugepage pool, which the
    /// kernel holds apart from ordinary pages.
    pub fn allocatable(&self, capacity: &ResourceList) -> ResourceList {
        let reserved = self.reservation(capacity);
        let mut allocatable: ResourceList = capacity
            .iter()
            .map(|(name, q)| {
                let r = reserved.get(name).map_or(0, |r| r.0);
                (name.clone(), Quantity((q.0 - r).max(0)))
            })
            .collect();
        let hugepages: i128 = capacity
            .iter()
            .filter(|(name, _)| name.starts_with(resources::HUGEPAGES_PREFIX))
            .map(|(_, q)| q.0)
            .sum();
        if let Some(memory) = allocatable.get_mut(resources::MEMORY) {
            memory.0 = (memory.0 - hugepages).max(0);
        }
        allocatable
    }
}

/// Which of the node's resources are under pressure now, measured against the hard eviction
/// thresholds: the inputs of the MemoryPressure, DiskPressure and PIDPressure conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    /// `memory.available` below its threshold.
    pub memory: bool,
    /// `nodefs.available` or `nodefs.inodesFree` below its threshold.
    pub disk: bool,
    /// `pid.available` below its threshold.
    pub pid: bool,
}

impl fmt::Display for Pressure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memory={} disk={} pid={}",
            self.memory, self.disk, self.pid
        )
    }
}

/// Observes the signals of `thresholds` on the host: `memory.available` as `MemAvailable`
/// (the kernel's estimate of what can be had without swapping; the eviction manager reads
/// the root cgroup's working set, which `MemAvailable` tracks on a host without swap),
/// `nodefs.*` with statvfs of `root_dir`, `pid.available` as `pid_max` minus the processes
/// the kernel counts. A signal that cannot be read is not pressure (the kubelet skips
/// signals it has no observation for).
pub fn observe_pressure(paths: &HostPaths, root_dir: &Path, thresholds: &Thresholds) -> Pressure {
    let below = |signal: &str, available: i128, capacity: i128| -> bool {
        thresholds
            .get(signal)
            .is_some_and(|t| Quantity(available * NANO) < t.against(Quantity(capacity * NANO)))
    };
    let mut pressure = Pressure::default();
    if let Ok(meminfo) = std::fs::read_to_string(paths.proc.join("meminfo"))
        && let (Some(total), Some(available)) = (
            meminfo_field(&meminfo, "MemTotal"),
            meminfo_field(&meminfo, "MemAvailable"),
        )
    {
        pressure.memory = below(
            signals::MEMORY_AVAILABLE,
            i128::from(available),
            i128::from(total),
        );
    }
    if let Ok(fs) = fs_stats(root_dir) {
        pressure.disk = below(
            signals::NODEFS_AVAILABLE,
            i128::from(fs.available),
            i128::from(fs.capacity),
        ) || below(
            signals::NODEFS_INODES_FREE,
            i128::from(fs.inodes_free),
            i128::from(fs.inodes),
        );
    }
    if thresholds.contains_key(signals::PID_AVAILABLE) {
        let pid_max = std::fs::read_to_string(paths.proc.join("sys/kernel/pid_max"))
            .ok()
            .and_then(|s| s.trim().parse::<i128>().ok());
        let running = std::fs::read_to_string(paths.proc.join("loadavg"))
            .ok()
            .and_then(|s| {
                // The fourth field: `runnable/total` scheduling entities.
                let field = s.split_whitespace().nth(3)?.to_string();
                field.split_once('/')?.1.parse::<i128>().ok()
            });
        if let (Some(max), Some(running)) = (pid_max, running) {
            pressure.pid = below(signals::PID_AVAILABLE, max - running, max);
        }
    }
    pressure
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).expect("test quantity")
    }

    #[test]
    fn quantities_are_written_in_canonical_form() {
        assert_eq!(format_quantity("memory", q("24683568Ki")), "24683568Ki");
        assert_eq!(format_quantity("memory", q("1073741824")), "1Gi");
        assert_eq!(format_quantity("memory", q("1000")), "1000");
        assert_eq!(format_quantity("memory", q("0")), "0");
        assert_eq!(format_quantity("hugepages-2Mi", q("0")), "0");
        assert_eq!(format_quantity("cpu", q("2")), "2");
        assert_eq!(format_quantity("cpu", q("1900m")), "1900m");
        assert_eq!(format_quantity("pods", q("110")), "110");
        assert_eq!(
            HugePages {
                page_size: 2048 * 1024,
                count: 0
            }
            .resource_name(),
            "hugepages-2Mi"
        );
        assert_eq!(
            HugePages {
                page_size: 1 << 30,
                count: 0
            }
            .resource_name(),
            "hugepages-1Gi"
        );
    }

    #[test]
    fn reserved_flags_parse_as_the_kubelet_parses_them() {
        let list =
            parse_reserved("cpu=100m,memory=256Mi,ephemeral-storage=1Gi,pid=1000").expect("valid");
        assert_eq!(list["cpu"], q("100m"));
        assert_eq!(list["memory"], q("256Mi"));
        assert_eq!(list["ephemeral-storage"], q("1Gi"));
        assert_eq!(list["pid"], q("1000"));
        assert!(
            parse_reserved("")
                .expect("empty is no reservation")
                .is_empty()
        );
        assert_eq!(parse_reserved(" cpu = 1 ").expect("trimmed")["cpu"], q("1"));
        assert_eq!(
            parse_reserved("gpu=1").unwrap_err().0,
            "cannot reserve \"gpu\" resource"
        );
        assert_eq!(
            parse_reserved("memory").unwrap_err().0,
            "malformed pair, expect string=string"
        );
        assert_eq!(
            parse_reserved("memory=-1Gi").unwrap_err().0,
            "resource quantity for \"memory\" cannot be negative: -1Gi"
        );
        assert!(parse_reserved("memory=lots").unwrap_err().0.starts_with(
            "failed to parse quantity \"lots\" for \"memory\" resource: quantities must match"
        ));
        let e = Reservations::parse("cpu=x", "", "").unwrap_err();
        assert!(
            e.0.starts_with("--kube-reserved: failed to parse quantity"),
            "{e}"
        );
    }

    #[test]
    fn eviction_thresholds_parse_with_percentages() {
        let t = parse_eviction_thresholds(EVICTION_HARD_DEFAULT).expect("the default parses");
        assert_eq!(t["memory.available"], ThresholdValue::Quantity(q("100Mi")));
        assert_eq!(
            t["nodefs.available"],
            ThresholdValue::PercentageMillionths(100_000)
        );
        assert_eq!(
            parse_eviction_thresholds("nodefs.available<7.5%").expect("fraction")["nodefs.available"],
            ThresholdValue::PercentageMillionths(75_000)
        );
        assert_eq!(
            parse_eviction_thresholds("memory.free<1Gi").unwrap_err().0,
            "unsupported eviction signal memory.free"
        );
        assert_eq!(
            parse_eviction_thresholds("nodefs.available<110%")
                .unwrap_err()
                .0,
            "eviction percentage threshold nodefs.available must be >= 0% and <= 100%: 110%"
        );
        assert_eq!(
            parse_eviction_thresholds("memory.available=1Gi")
                .unwrap_err()
                .0,
            "malformed pair, expect string<string"
        );
    }

    fn capacity() -> ResourceList {
        let machine = MachineInfo {
            num_cpus: 2,
            memory_capacity: 4 << 30,
            hugepages: vec![HugePages {
                page_size: 2 << 20,
                count: 64,
            }],
            ephemeral_storage: 100 << 30,
            kernel_version: String::new(),
            os_image: String::new(),
            boot_id: String::new(),
            machine_id: String::new(),
            system_uuid: String::new(),
            architecture: "amd64",
            operating_system: "linux",
        };
        machine.capacity(MAX_PODS_DEFAULT)
    }

    #[test]
    fn allocatable_is_capacity_minus_every_reservation() {
        let r = Reservations::parse(
            "cpu=100m,memory=256Mi,ephemeral-storage=1Gi,pid=1000",
            "cpu=50m,memory=128Mi",
            EVICTION_HARD_DEFAULT,
        )
        .expect("valid flags");
        let cap = capacity();
        let alloc = to_api(&r.allocatable(&cap));
        assert_eq!(alloc["cpu"].0, "1850m");
        // 4Gi - 256Mi - 128Mi - 100Mi (eviction) - 128Mi (64 hugepages of 2Mi).
        assert_eq!(
            alloc["memory"].0,
            (4096 - 256 - 128 - 100 - 128).to_string() + "Mi"
        );
        // 100Gi - 1Gi - 10% of 100Gi.
        assert_eq!(alloc["ephemeral-storage"].0, "89Gi");
        assert_eq!(alloc["pods"].0, "110");
        assert_eq!(alloc["hugepages-2Mi"].0, "128Mi");
        assert!(
            !alloc.contains_key("pid"),
            "pid is reserved, never a capacity"
        );
    }

    #[test]
    fn allocatable_never_goes_below_zero() {
        let r = Reservations::parse("cpu=8,memory=64Gi", "", "").expect("valid");
        let alloc = to_api(&r.allocatable(&capacity()));
        assert_eq!(alloc["cpu"].0, "0");
        assert_eq!(alloc["memory"].0, "0");
    }

    #[test]
    fn host_files_parse() {
        let meminfo = "MemTotal:       24683568 kB\nMemFree:  1 kB\nHugePages_Total: 0\n";
        assert_eq!(meminfo_field(meminfo, "MemTotal"), Some(24683568 * 1024));
        assert_eq!(meminfo_field(meminfo, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_field(meminfo, "MemAvailable"), None);
        let os = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n";
        assert_eq!(
            os_release_field(os, "PRETTY_NAME").as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(os_release_field(os, "ID").as_deref(), Some("debian"));
        assert_eq!(
            os_release_field("PRETTY_NAME='A \"b\"'", "PRETTY_NAME").as_deref(),
            Some("A \"b\"")
        );
        assert_eq!(cpu_list_len("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_list_len("0"), Some(1));
        assert_eq!(cpu_list_len("3-1"), None);
    }

    #[test]
    fn a_fake_host_is_read_through_its_paths() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        let write = |p: &str, s: &str| {
            let path = root.join(p);
            std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
            std::fs::write(path, s).expect("write");
        };
        write("proc/meminfo", "MemTotal: 2048 kB\nMemAvailable: 10 kB\n");
        write("proc/sys/kernel/random/boot_id", "boot-1\n");
        write("etc/machine-id", "machine-1\n");
        write("etc/os-release", "PRETTY_NAME=\"Skerry OS\"\n");
        write(
            "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "3\n",
        );
        write(
            "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
            "1\n",
        );
        write("sys/class/dmi/id/product_uuid", "UUID-1\n");
        let paths = HostPaths {
            proc: root.join("proc"),
            sys: root.join("sys"),
            etc: root.join("etc"),
            usr_lib: root.join("usr/lib"),
        };
        let m = MachineInfo::read(&paths, root).expect("the fake host reads");
        assert_eq!(m.memory_capacity, 2048 * 1024);
        assert_eq!(m.boot_id, "boot-1");
        assert_eq!(m.machine_id, "machine-1");
        assert_eq!(m.os_image, "Skerry OS");
        assert_eq!(m.system_uuid, "UUID-1");
        assert_eq!(
            m.hugepages,
            [
                HugePages {
                    page_size: 2 << 20,
                    count: 3
                },
                HugePages {
                    page_size: 1 << 30,
                    count: 1
                }
            ]
        );
        let cap = to_api(&m.capacity(7));
        assert_eq!(cap["hugepages-2Mi"].0, "6Mi");
        assert_eq!(cap["hugepages-1Gi"].0, "1Gi");
        assert_eq!(cap["pods"].0, "7");
        assert_eq!(cap["memory"].0, "2Mi");
        // 10 kB available of 2 MiB: under the default 100Mi threshold.
        let thresholds = parse_eviction_thresholds(EVICTION_HARD_DEFAULT).expect("default");
        assert!(observe_pressure(&paths, root, &thresholds).memory);
        assert!(!observe_pressure(&paths, root, &Thresholds::new()).memory);
    }
}
