//! skerry's controllers (`docs/tricks.md`, part 5: acting on a cache that lags): each
//! reads from shared informers, decides, and writes through the apiserver; they run only on
//! the member that holds the `kube-controller-manager` Lease.

pub mod context;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod expectations;
pub mod garbagecollector;
pub mod hash;
pub mod manager;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod podcontrol;
pub mod replicaset;
pub mod rootcacertpublisher;
pub mod runtime;
pub mod serviceaccount;
pub mod statefulset;
pub mod util;
