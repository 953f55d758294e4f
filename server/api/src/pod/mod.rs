//! Kubernetes' pod semantics that more than one component evaluates: whether a pod
//! tolerates a node's taints ([`taints`]), whether a node satisfies its node selector and
//! node affinity ([`nodeaffinity`]), and how much it requests of a node ([`resources`]).
//!
//! Upstream these live in `k8s.io/component-helpers` (`scheduling/corev1`,
//! `scheduling/corev1/nodeaffinity`, `resource`) and `k8s.io/api/core/v1`, and the scheduler,
//! the DaemonSet controller, the node lifecycle controller and the kubelet's admission
//! (`GeneralPredicates` in `pkg/kubelet/lifecycle/predicate.go`) all call the same copy, so a
//! pod the scheduler placed is never refused by the kubelet for a difference in reading. Here
//! too: pure functions over k8s-openapi types, one copy, in the crate every component
//! depends on. Label selectors, which these build on, are [`crate::selector`].

pub mod nodeaffinity;
pub mod resources;
pub mod taints;
