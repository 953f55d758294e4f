//! The Kubernetes API surface shared by skerry's apiserver and its clients.
//!
//! - [`catalogue`]: every resource served, its group/version/kind, scope, verbs and store key.
//! - [`status`]: errors as Kubernetes `Status` objects, with Kubernetes' reasons and codes.
//! - [`selector`]: label and field selectors, the one implementation every component uses.
//! - [`pod`]: the pod predicates more than one component evaluates (tolerations, node
//!   affinity, resource requests).
//! - [`retry`]: client-go's retry on conflict, for controllers and the apiserver alike.
//!
//! Start with the catalogue: the apiserver's routing, discovery and watch caches are driven
//! by it.

#![allow(
    clippy::result_large_err,
    reason = "ApiError (a Status with its causes) is returned at most once per request; boxing it would cost an allocation on every error for no measurable gain"
)]

pub mod catalogue;
pub mod defaults;
pub mod goquote;
pub mod kinds;
pub mod meta;
pub mod node;
pub mod patch;
pub mod pod;
pub mod protobuf;
pub mod retry;
pub mod schema;
pub mod selector;
pub mod status;
pub mod strict;
pub mod table;
pub mod validation;

pub use catalogue::{RESOURCES, ResourceInfo};
pub use status::{ApiError, Cause};
