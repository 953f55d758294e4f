//! The machine's CPU topology as the resource managers see it (upstream
//! `pkg/kubelet/cm/cpumanager/topology/topology.go` `Discover`, over cadvisor's machine
//! info): every online CPU with its core, socket and NUMA node, and each NUMA node's memory.
//! Read from /sys: `devices/system/cpu/online`, `cpu<N>/topology/{core_id,
//! physical_package_id}`, `devices/system/node/node<N>/{cpulist,meminfo}`, and each node's
//! hugepage pools from `devices/system/node/node<N>/hugepages/hugepages-<size>kB/nr_hugepages`
//! (cadvisor's `GetNodesInfo`, what the memory manager's `Static` policy allocates from). A
//! kernel without NUMA (no `node<N>` folders) is one node, 0, holding every CPU,
//! `/proc/meminfo`'s memory and the machine's pools (`kernel/mm/hugepages`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::checkpoint::cpu_manager::{CpuSet, parse_cpuset};
use crate::machine::HugePages;

use super::bitmask::MAX_BITS;

/// One logical CPU (`CPUInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    pub cpu: u32,
    /// A core id unique on the machine (the kernel's `core_id` repeats per socket).
    pub core: u32,
    pub socket: u32,
    pub numa: u32,
}

/// The machine: its CPUs and its NUMA nodes' memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub cpus: Vec<CpuInfo>,
    /// NUMA node -> memory in bytes (`MemTotal`).
    pub numa_memory: BTreeMap<u32, u64>,
    /// NUMA node -> its hugepage pools (page size, `nr_hugepages`); a node without pools
    /// has no entry.
    pub numa_hugepages: BTreeMap<u32, Vec<HugePages>>,
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_string())
        .map_err(|e| format!("read {}: {e}", path.display()))
}

fn number(path: &Path) -> Result<u32, String> {
    let t = read(path)?;
    t.parse()
        .map_err(|_| format!("{}: not a number: {t:?}", path.display()))
}

/// `MemTotal` of a `meminfo` text (`Node 0 MemTotal: 24683584 kB` or `MemTotal: ... kB`).
fn mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.contains("MemTotal:"))?;
    let kb = line.split("MemTotal:").nth(1)?.split_whitespace().next()?;
    kb.parse::<u64>().ok()?.checked_mul(1024)
}

impl Machine {
    /// Reads the topology under `sys` (`/sys`) and `proc_meminfo` (`/proc/meminfo`, used
    /// when the kernel has no NUMA nodes).
    pub fn discover(sys: &Path, proc_meminfo: &Path) -> Result<Machine, String> {
        let cpu_dir = sys.join("devices/system/cpu");
        let online = parse_cpuset(&read(&cpu_dir.join("online"))?)
            .map_err(|e| format!("{}: {e}", cpu_dir.join("online").display()))?;
        let node_dir = sys.join("devices/system/node");
        let mut numa_of: BTreeMap<u32, u32> = BTreeMap::new();
        let mut numa_memory = BTreeMap::new();
        let mut numa_hugepages = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(&node_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = name
                    .strip_prefix("node")
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                if id >= MAX_BITS {
                    return Err(format!("NUMA node id {id} is 64 or more"));
                }
                let list = read(&e.path().join("cpulist"))?;
                let cpus = parse_cpuset(&list)
                    .map_err(|err| format!("{}: {err}", e.path().join("cpulist").display()))?;
                for c in cpus {
                    numa_of.insert(c, id);
                }
                let mem = read(&e.path().join("meminfo"))
                    .ok()
                    .and_then(|t| mem_total(&t))
                    .unwrap_or(0);
                numa_memory.insert(id, mem);
                let pools = crate::machine::hugepages(&e.path().join("hugepages"))
                    .map_err(|err| err.to_string())?;
                if !pools.is_empty() {
                    numa_hugepages.insert(id, pools);
                }
            }
        }
        if numa_memory.is_empty() {
            let mem = mem_total(&read(proc_meminfo)?).unwrap_or(0);
            numa_memory.insert(0, mem);
            let pools = crate::machine::hugepages(&sys.join("kernel/mm/hugepages"))
                .map_err(|err| err.to_string())?;
            if !pools.is_empty() {
                numa_hugepages.insert(0, pools);
            }
        }
        // Core ids made unique per (socket, core_id), in the order the CPUs come.
        let mut cores: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        let mut cpus = Vec::new();
        for cpu in online {
            let topo = cpu_dir.join(format!("cpu{cpu}/topology"));
            let socket = number(&topo.join("physical_package_id"))?;
            let core_id = number(&topo.join("core_id"))?;
            let next = cores.len() as u32;
            let core = *cores.entry((socket, core_id)).or_insert(next);
            cpus.push(CpuInfo {
                cpu,
                core,
                socket,
                numa: numa_of.get(&cpu).copied().unwrap_or(0),
            });
        }
        if cpus.is_empty() {
            return Err(format!("no online CPU in {}", cpu_dir.display()));
        }
        Ok(Machine {
            cpus,
            numa_memory,
            numa_hugepages,
        })
    }

    /// The machine's own topology (`/sys`, `/proc/meminfo`).
    pub fn host() -> Result<Machine, String> {
        Machine::discover(Path::new("/sys"), Path::new("/proc/meminfo"))
    }

    /// A machine given as data: `(cpu, core, socket, numa)` per CPU, memory per node.
    pub fn from_table(cpus: &[(u32, u32, u32, u32)], memory_per_node: u64) -> Machine {
        let cpus: Vec<CpuInfo> = cpus
            .iter()
            .map(|&(cpu, core, socket, numa)| CpuInfo {
                cpu,
                core,
                socket,
                numa,
            })
            .collect();
        let numa_memory = cpus.iter().map(|c| (c.numa, memory_per_node)).collect();
        Machine {
            cpus,
            numa_memory,
            numa_hugepages: BTreeMap::new(),
        }
    }

    /// The NUMA node ids, ascending.
    pub fn numa_nodes(&self) -> Vec<u32> {
        self.numa_memory.keys().copied().collect()
    }

    /// Every CPU.
    pub fn all_cpus(&self) -> CpuSet {
        self.cpus.iter().map(|c| c.cpu).collect()
    }

    /// The CPUs of the NUMA nodes `nodes` (`CPUsInNUMANodes`).
    pub fn cpus_in_numa(&self, nodes: &[u32]) -> CpuSet {
        self.cpus
            .iter()
            .filter(|c| nodes.contains(&c.numa))
            .map(|c| c.cpu)
            .collect()
    }

    /// The facts of `cpu`.
    pub fn cpu(&self, cpu: u32) -> Option<&CpuInfo> {
        self.cpus.iter().find(|c| c.cpu == cpu)
    }

    /// How many CPUs a core has (`CPUsPerCore`), a socket (`CPUsPerSocket`).
    pub fn cpus_per_core(&self) -> usize {
        let cores: BTreeSet<u32> = self.cpus.iter().map(|c| c.core).collect();
        self.cpus.len() / cores.len().max(1)
    }

    /// See [`Machine::cpus_per_core`].
    pub fn cpus_per_socket(&self) -> usize {
        let sockets: BTreeSet<u32> = self.cpus.iter().map(|c| c.socket).collect();
        self.cpus.len() / sockets.len().max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    #[test]
    fn reads_a_two_node_machine_from_a_sys_tree() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path();
        write(root, "devices/system/cpu/online", "0-3\n");
        // Two sockets, two cores each, core ids repeating per socket as the kernel's do.
        for (cpu, core, socket) in [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)] {
            write(
                root,
                &format!("devices/system/cpu/cpu{cpu}/topology/core_id"),
                &format!("{core}\n"),
            );
            write(
                root,
                &format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id"),
                &format!("{socket}\n"),
            );
        }
        write(root, "devices/system/node/node0/cpulist", "0-1\n");
        write(root, "devices/system/node/node1/cpulist", "2-3\n");
        write(
            root,
            "devices/system/node/node0/meminfo",
            "Node 0 MemTotal:       1024 kB\nNode 0 MemFree: 10 kB\n",
        );
        write(
            root,
            "devices/system/node/node1/meminfo",
            "Node 1 MemTotal:       2048 kB\n",
        );
        write(root, "devices/system/node/online", "0-1\n");
        write(
            root,
            "devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages",
            "4\n",
        );
        write(
            root,
            "devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages",
            "0\n",
        );
        let m = Machine::discover(root, &root.join("meminfo")).expect("machine");
        assert_eq!(m.numa_hugepages.get(&0), None, "node 0 has no pools");
        let pools: Vec<(String, u64)> = m.numa_hugepages[&1]
            .iter()
            .map(|p| (p.resource_name(), p.count))
            .collect();
        assert_eq!(
            pools,
            [
                ("hugepages-2Mi".to_string(), 4),
                ("hugepages-1Gi".to_string(), 0)
            ]
        );
        assert_eq!(m.numa_nodes(), vec![0, 1]);
        assert_eq!(m.numa_memory[&1], 2 << 20);
        assert_eq!(m.cpus_in_numa(&[1]), CpuSet::from([2, 3]));
        let cores: Vec<u32> = m.cpus.iter().map(|c| c.core).collect();
        assert_eq!(cores, vec![0, 1, 2, 3], "core ids unique across sockets");
        assert_eq!((m.cpus_per_core(), m.cpus_per_socket()), (1, 2));
    }

    #[test]
    fn this_machine() {
        let m = Machine::host().expect("this machine's topology");
        let mut numa_cpus = CpuSet::new();
        for n in m.numa_nodes() {
            let list = std::fs::read_to_string(format!("/sys/devices/system/node/node{n}/cpulist"))
                .unwrap_or_default();
            numa_cpus.extend(parse_cpuset(list.trim()).unwrap_or_default());
        }
        if !numa_cpus.is_empty() {
            assert_eq!(m.all_cpus(), numa_cpus);
        }
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online");
        assert_eq!(m.all_cpus(), parse_cpuset(online.trim()).expect("cpuset"));
        assert!(m.numa_memory.values().all(|&b| b > 0));
    }
}
