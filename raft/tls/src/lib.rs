//! skerry's TLS and PKI in one place: every listener and every certificate of `skerry server`
//! goes through this crate, so the peer port, the etcd client port, the Kubernetes API port,
//! the in-process test servers and the benchmarks cannot drift apart.
//!
//! # Layout
//! - [`pki`]: the cluster CA and the leaf certificates it issues (server, client or both, with
//!   their subject alternative names), in one call for the two shapes Kubernetes keeps asking
//!   for: "a serving certificate for node X with these IPs" ([`pki::Ca::node_serving_cert`])
//!   and "a client certificate for user U in groups G" ([`pki::Ca::client_cert`]); a leaf
//!   checked against its CA; PEM files written atomically with private modes.
//! - [`config`]: rustls with ring: PEM files read with errors that name the flag that gave
//!   them, one server configuration builder (client certificates off, optional or required
//!   against a CA; an ALPN list) and one client configuration builder.
//! - [`accept`]: what every listener puts around `accept`: backoff while it fails, the cap on
//!   connections that have not yet proved themselves, the accept loop itself, and a TLS
//!   handshake (either side) bounded by the listener's own deadline.
//!
//! Each listener keeps its own deadlines and caps as named constants beside it (they differ on
//! purpose: the peer port's 5 s for handshake and hello in `raft/src/transport.rs`, the API
//! port's 10 s TLS and 32 s first request head in `server/apiserver/src/server.rs`, the client
//! port's 10 s in `appliance/src/client_port.rs`); this crate only carries them out.
//!
//! # Why here
//! The crate must be importable by the Raft transport, the apiserver, the binary and the test
//! crate, and must itself know nothing of the store, Raft or Kubernetes (the store knows
//! nothing of TLS either). The workspace's top-level folders are fixed, so it sits under
//! `raft/`: the peer transport's mutual TLS was its first user and `raft` is the lowest crate
//! that needs it; `skerry-raft` depends on it, never the reverse.

pub mod accept;
pub mod config;
pub mod error;
pub mod pki;

pub use error::Error;
