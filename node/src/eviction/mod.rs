//! The kubelet's eviction (upstream `pkg/kubelet/eviction`). What exists so far is the part
//! that wakes it: [`notifier`], the kernel telling the kubelet that memory crossed a
//! threshold (memcg thresholds on an eventfd on cgroup v1, PSI triggers on v2), so the loop
//! sleeps between its housekeeping passes instead of polling.

pub mod notifier;
