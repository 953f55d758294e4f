//! The lessor: leases, their expiry clocks and the keys attached to them.
//!
//! Grants and revocations are commands (so every member agrees on them); expiry is decided by
//! whoever drives the store (here the single node, later the Raft leader), which proposes a
//! revocation for each expired lease. Keep-alives only move the in-memory deadline, as in etcd.
//! After a restart every lease gets its full TTL again, as etcd does after a leader change,
//! rather than expiring at once for time the store was down.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// The shortest TTL a lease gets. etcd raises shorter requests to 1.5 election timeouts
/// (default 1 s), rounded up to whole seconds: 2 s. A lease shorter than one election could
/// expire during a leader change that the client could do nothing about.
pub const LEASE_TTL_MIN_SECONDS: i64 = 2;

/// The longest TTL etcd accepts (`MaxLeaseTTL`, about 285 years); longer is "too large".
pub const LEASE_TTL_MAX_SECONDS: i64 = 9_000_000_000;

#[derive(Debug)]
pub struct Lease {
    pub ttl_seconds: i64,
    pub expiry: Instant,
    pub keys: BTreeSet<Bytes>,
    /// A revocation was proposed for it; do not propose another.
    pub revoking: bool,
}

#[derive(Debug, Default)]
pub struct Lessor {
    leases: HashMap<i64, Lease>,
}

impl Lessor {
    pub fn contains(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    pub fn grant(&mut self, id: i64, ttl_seconds: i64) {
        self.leases.insert(
            id,
            Lease {
                ttl_seconds,
                expiry: Instant::now() + ttl(ttl_seconds),
                keys: BTreeSet::new(),
                revoking: false,
            },
        );
    }

    pub fn revoke(&mut self, id: i64) {
        self.leases.remove(&id);
    }

    pub fn attach(&mut self, id: i64, key: &Bytes) {
        if let Some(lease) = self.leases.get_mut(&id) {
            // A copy, so that the lessor never pins the request buffer the key was decoded
            // from (see `KeyIndex::push`).
            if !lease.keys.contains(key) {
                lease.keys.insert(Bytes::copy_from_slice(key));
            }
        }
    }

    pub fn detach(&mut self, id: i64, key: &[u8]) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.keys.remove(key);
        }
    }

    pub fn keys(&self, id: i64) -> Option<&BTreeSet<Bytes>> {
        self.leases.get(&id).map(|l| &l.keys)
    }

    pub fn get(&self, id: i64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    /// Renews a lease; returns its TTL, or `None` if it does not exist.
    pub fn keep_alive(&mut self, id: i64) -> Option<i64> {
        let lease = self.leases.get_mut(&id)?;
        if lease.revoking {
            // Its revocation is already on its way; renewing now would only race it.
            return None;
        }
        lease.expiry = Instant::now() + ttl(lease.ttl_seconds);
        Some(lease.ttl_seconds)
    }

    /// Seconds left, rounded up, as etcd reports (`-1` once expired).
    pub fn remaining_seconds(lease: &Lease, now: Instant) -> i64 {
        match lease.expiry.checked_duration_since(now) {
            Some(left) => i64::try_from(left.as_millis().div_ceil(1000)).unwrap_or(i64::MAX),
            None => -1,
        }
    }

    pub fn ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.leases.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Expired leases not yet being revoked, marked as being revoked; at most `limit`.
    pub fn take_expired(&mut self, now: Instant, limit: usize) -> Vec<i64> {
        let mut expired: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, l)| !l.revoking && l.expiry <= now)
            .map(|(id, _)| *id)
            .collect();
        expired.sort_unstable();
        expired.truncate(limit);
        for id in &expired {
            if let Some(lease) = self.leases.get_mut(id) {
                lease.revoking = true;
            }
        }
        expired
    }

    /// This member became the one that decides expiry (the Raft leader): every lease gets its
    /// full TTL from now, as etcd's `Promote` does, so that a client whose keep-alives went to
    /// the old leader is not expired for the election's gap. Pending revocations are
    /// forgotten: the new leader decides afresh.
    pub fn promote(&mut self) {
        let now = Instant::now();
        for lease in self.leases.values_mut() {
            lease.expiry = now + ttl(lease.ttl_seconds);
            lease.revoking = false;
        }
    }

    /// A revocation proposal failed: let the expiry loop try again.
    pub fn revoke_failed(&mut self, id: i64) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.revoking = false;
        }
    }
}

fn ttl(seconds: i64) -> Duration {
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attached_key_is_copied_out_of_the_request_buffer() {
        let buffer = Bytes::from(vec![b'k'; 8192]);
        let key = buffer.slice(0..4);
        let mut lessor = Lessor::default();
        lessor.grant(7, 60);
        lessor.attach(7, &key);
        lessor.attach(7, &key);
        let keys = &lessor.leases[&7].keys;
        assert_eq!(keys.len(), 1);
        let stored = keys.first().expect("one key");
        assert_eq!(stored.as_ref(), b"kkkk");
        assert!(!buffer.as_ptr_range().contains(&stored.as_ptr()));
    }

    #[test]
    fn expired_leases_are_handed_out_once() {
        let mut lessor = Lessor::default();
        lessor.grant(7, 2);
        let later = Instant::now() + Duration::from_secs(3);
        assert_eq!(lessor.take_expired(Instant::now(), 10), Vec::<i64>::new());
        assert_eq!(lessor.take_expired(later, 10), vec![7]);
        assert_eq!(
            lessor.take_expired(later, 10),
            Vec::<i64>::new(),
            "already revoking"
        );
        lessor.revoke_failed(7);
        assert_eq!(lessor.take_expired(later, 10), vec![7]);
    }

    #[test]
    fn remaining_ttl_rounds_up() {
        let mut lessor = Lessor::default();
        lessor.grant(1, 10);
        let lease = lessor.get(1).expect("granted");
        let now = Instant::now();
        assert_eq!(Lessor::remaining_seconds(lease, now), 10);
        assert_eq!(
            Lessor::remaining_seconds(lease, now + Duration::from_millis(9_500)),
            1
        );
        assert_eq!(
            Lessor::remaining_seconds(lease, now + Duration::from_secs(11)),
            -1
        );
    }
}
