//! skerry's Kubernetes apiserver: the Kubernetes API over the store, for the real kubectl.
//!
//! # Layout
//! - [`server`]: TLS + hyper (HTTP/1.1 and HTTP/2), in-flight limits.
//! - [`handler`]: authenticate ([`auth`]), authorize (RBAC over [`rbac_cache`]), route.
//! - [`node_authz`] over [`node_graph`]: the Node authorizer, before RBAC;
//!   [`noderestriction`]: the NodeRestriction admission plugin.
//! - [`reviews`]: the access reviews and TokenReview, answered and never stored.
//! - [`verbs`], [`subresources`], [`watch`]: the generic registry over [`storage`] (the
//!   store side: paged LIST with the doubling page size, CAS writes) and the per-resource
//!   [`watch_cache`] (serialize-once fan-out, bookmark buckets, the 3-second wait, WatchList).
//! - [`strategy`]: each resource's rules (Kubernetes' strategies), one file per resource
//!   with rules of its own; the verbs ask them and never name a resource.
//! - [`discovery`], [`openapi`], [`table`], [`metrics`]: what clients read about the API.
//! - [`compactor`]: the CAS-elected compactor.
//!
//! Start at [`ApiServer::start`] and [`server::serve`].

#![allow(
    clippy::result_large_err,
    reason = "ApiError (a Status with its causes) is returned at most once per request; boxing it would cost an allocation on every error for no measurable gain"
)]

pub mod admission;
pub mod auth;
pub mod compactor;
pub mod discovery;
pub mod handler;
pub mod ipalloc;
pub mod leases;
pub mod metrics;
pub mod node_authz;
pub mod node_graph;
pub mod nodeproxy;
pub mod noderestriction;
pub mod openapi;
pub mod podexec;
pub mod podlogs;
pub mod portalloc;
pub mod rbac_cache;
pub mod request;
pub mod response;
pub mod reviews;
pub mod server;
pub mod serviceaccount_admission;
pub mod startup;
pub mod storage;
pub mod strategy;
pub mod subresources;
pub mod table;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verbs;
pub mod watch;
pub mod watch_cache;
pub mod yaml;

pub use handler::ApiServer;
