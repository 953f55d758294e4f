//! The kubelet's resource managers (upstream `pkg/kubelet/cm/`): which CPUs and which NUMA
//! nodes a container may use.
//!
//! - [`topology`]: the machine's NUMA nodes, sockets, cores and CPUs read from /sys, and the
//!   topology manager that merges the providers' NUMA hints by bitwise AND and admits or
//!   rejects a pod (`TopologyAffinityError`);
//! - [`cpu_manager`]: the CPU manager, `none` or `static` (exclusive CPUs for the integer CPU
//!   requests of Guaranteed pods, a shared pool for everything else), kept in the
//!   `cpu_manager_state` checkpoint and reconciled into every container's cpuset over CRI.
//!
//! The trick they carry: each provider answers "which NUMA masks could hold this
//! container?", the manager ANDs one mask of every provider over the cross product of their
//! answers and keeps the narrowest preferred result, and a provider with no preference
//! contributes a don't-care hint (all ones, preferred), never a zero that would veto the
//! merge.

pub mod cpu_manager;
pub mod topology;
