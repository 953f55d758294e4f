//! Picking CPUs so a container's set is packed (upstream
//! `pkg/kubelet/cm/cpumanager/cpu_assignment.go` `takeByTopologyNUMAPacked`): whole free
//! sockets first when the request is that large, then whole free cores, then single CPUs
//! from the fullest sockets and cores first, so the free CPUs stay together for the next
//! large request and two containers share as few cores as possible.

use std::collections::BTreeMap;

use crate::checkpoint::cpu_manager::CpuSet;
use crate::cm::topology::machine::Machine;

/// Takes `n` CPUs of `available` (`takeByTopology`); upstream's error when there are fewer.
pub fn take_by_topology(machine: &Machine, available: &CpuSet, n: usize) -> Result<CpuSet, String> {
    if n > available.len() {
        return Err(format!(
            "not enough cpus available to satisfy request: requested={n}, available={}",
            available.len()
        ));
    }
    let mut free = available.clone();
    let mut result = CpuSet::new();
    let group = |free: &CpuSet, key: fn(&crate::cm::topology::machine::CpuInfo) -> u32| {
        let mut all: BTreeMap<u32, CpuSet> = BTreeMap::new();
        let mut avail: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for c in &machine.cpus {
            all.entry(key(c)).or_default().insert(c.cpu);
            if free.contains(&c.cpu) {
                avail.entry(key(c)).or_default().insert(c.cpu);
            }
        }
        (all, avail)
    };
    // Whole sockets (`takeFullSockets`), lowest id first.
    let per_socket = machine.cpus_per_socket();
    if per_socket > 0 && n - result.len() >= per_socket {
        let (all, avail) = group(&free, |c| c.socket);
        for (socket, cpus) in &all {
            if n - result.len() < per_socket {
                break;
            }
            if avail.get(socket) == Some(cpus) {
                result.extend(cpus.iter().copied());
                free.retain(|c| !cpus.contains(c));
            }
        }
    }
    // Whole cores (`takeFullCores`), in the sockets with the fewest free CPUs first.
    let per_core = machine.cpus_per_core();
    if per_core > 0 && n - result.len() >= per_core {
        let (all_cores, avail_cores) = group(&free, |c| c.core);
        let (_, avail_sockets) = group(&free, |c| c.socket);
        let socket_free = |core: u32| {
            let socket = machine
                .cpus
                .iter()
                .find(|c| c.core == core)
                .map_or(0, |c| c.socket);
            (avail_sockets.get(&socket).map_or(0, |s| s.len()), socket)
        };
        let mut cores: Vec<u32> = all_cores
            .iter()
            .filter(|(core, cpus)| avail_cores.get(core) == Some(cpus))
            .map(|(core, _)| *core)
            .collect();
        cores.sort_by_key(|&core| (socket_free(core), core));
        for core in cores {
            if n - result.len() < per_core {
                break;
            }
            let cpus = &all_cores[&core];
            result.extend(cpus.iter().copied());
            free.retain(|c| !cpus.contains(c));
        }
    }
    // Single CPUs (`takeRemainingCPUs`, `sortAvailableCPUsPacked`): fullest socket, then
    // fullest core, then id.
    if result.len() < n {
        let (_, avail_sockets) = group(&free, |c| c.socket);
        let (_, avail_cores) = group(&free, |c| c.core);
        let mut cpus: Vec<_> = machine
            .cpus
            .iter()
            .filter(|c| free.contains(&c.cpu))
            .collect();
        cpus.sort_by_key(|c| {
            (
                avail_sockets.get(&c.socket).map_or(0, |s| s.len()),
                c.socket,
                avail_cores.get(&c.core).map_or(0, |s| s.len()),
                c.core,
                c.cpu,
            )
        });
        for c in cpus.into_iter().take(n - result.len()) {
            result.insert(c.cpu);
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sockets (= NUMA nodes), two cores each, two threads per core: siblings are
    /// (0,4) (1,5) on socket 0, (2,6) (3,7) on socket 1.
    fn smt() -> Machine {
        Machine::from_table(
            &[
                (0, 0, 0, 0),
                (1, 1, 0, 0),
                (2, 2, 1, 1),
                (3, 3, 1, 1),
                (4, 0, 0, 0),
                (5, 1, 0, 0),
                (6, 2, 1, 1),
                (7, 3, 1, 1),
            ],
            1 << 30,
        )
    }

    fn set(c: &[u32]) -> CpuSet {
        c.iter().copied().collect()
    }

    #[test]
    fn packs_sockets_cores_then_the_fullest_core() {
        let m = smt();
        let all = m.all_cpus();
        assert_eq!(
            take_by_topology(&m, &all, 4),
            Ok(set(&[0, 1, 4, 5])),
            "a socket"
        );
        assert_eq!(
            take_by_topology(&m, &all, 2),
            Ok(set(&[0, 4])),
            "a core, both threads"
        );
        assert_eq!(take_by_topology(&m, &all, 1), Ok(set(&[0])));
        // With 0 taken, one CPU comes from the half-used core (4), not a free one.
        let rest = set(&[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(take_by_topology(&m, &rest, 1), Ok(set(&[4])));
        // Three: the fullest socket's free core, then its last thread.
        assert_eq!(take_by_topology(&m, &rest, 3), Ok(set(&[1, 4, 5])));
        assert_eq!(
            take_by_topology(&m, &set(&[1]), 2),
            Err("not enough cpus available to satisfy request: requested=2, available=1".into())
        );
    }
}
