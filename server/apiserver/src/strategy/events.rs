//! Events (`pkg/registry/core/event`): they expire. Every create and every update (the
//! Event happened again, its count went up) attaches the object to a shared store lease of
//! the server's Event TTL ([`crate::leases`]), as Kubernetes' Event storage sets its
//! `TTLFunc`.

use super::Strategy;
use crate::handler::ApiServer;
use crate::leases::LeaseManager;

/// The Event strategy.
pub struct Events;

impl Strategy for Events {
    fn ttl_leases<'s>(&self, server: &'s ApiServer) -> Option<&'s LeaseManager> {
        Some(&server.event_leases)
    }
}
