//! The strategy of a resource without rules of its own (ConfigMaps, Secrets, Nodes, the
//! workloads, RBAC, ...): every hook is [`Strategy`]'s default, which is Kubernetes'
//! generic behaviour plus the kind's metadata, defaults and validation from `skerry_api`.

use super::Strategy;

/// The default strategy.
pub struct Default;

impl Strategy for Default {}
