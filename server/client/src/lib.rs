//! skerry's client library for the Kubernetes API — what every controller is built on
//! (`docs/tricks.md`, part 3: #15-21).
//!
//! The pieces, in the order an object travels through them:
//! - [`api`]: a typed HTTP(S) client ([`Client`], [`Api`]) over hyper + rustls, speaking JSON
//!   and protobuf, with client-go's QPS/burst rate limiting ([`flowcontrol`]) and watch
//!   streams; [`config`] loads kubeconfigs.
//! - [`reflector`]: LIST + WATCH (or one WatchList stream) into a store, withholding resource
//!   versions it has not earned, with client-go's backoff ([`backoff`]).
//! - [`delta_fifo`]: the queue between the reflector and the informer, with its delta types
//!   and tombstones.
//! - [`cache`]: the thread-safe indexed store that listers read.
//! - [`informer`]: the shared informer, one unbounded ring per handler.
//! - [`workqueue`]: two sets and a FIFO, `add_after` on one heap, rate limiters.
//! - [`leaderelection`]: Lease-based leader election that trusts only its own clock.
//! - [`retry`]: client-go's retry on conflict, for a controller's read-modify-write.

pub mod api;
pub mod backoff;
pub mod cache;
pub mod config;
pub mod delta_fifo;
pub mod error;
pub mod events;
pub mod flowcontrol;
pub mod informer;
pub mod leaderelection;
pub mod object;
pub mod reflector;
pub mod retry;
pub mod workqueue;

pub use api::{
    Api, Client, DeleteParams, ListParams, MetadataApi, ObjectList, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams, WatchStream,
};
pub use config::{Config, ContentType, Credentials};
pub use error::Error;
pub use object::{ApiResource, Object, PartialObjectMetadata, key_of};
