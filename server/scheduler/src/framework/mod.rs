//! The scheduling framework's types and plugin interfaces (Kubernetes'
//! `pkg/scheduler/framework`). SKELETON: data types and traits fixed; methods to be filled.

pub mod interface;
pub mod nodeinfo;
pub mod runtime;
pub mod types;

pub use interface::*;
pub use nodeinfo::*;
pub use types::*;
