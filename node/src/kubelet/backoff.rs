//! The restart and image-pull backoff (upstream `k8s.io/client-go/util/flowcontrol/backoff.go`
//! as the kubelet uses it in `kuberuntime_manager.go` `doBackOff` and `images/image_manager.go`).
//!
//! One entry per key (a container of a pod, or an image of a pod). [`Backoff::next`] is called
//! when the thing fails, with the time it failed: the first failure waits [`INITIAL`], each
//! later one twice the last, up to [`MAX`]. An entry whose last failure is more than twice
//! [`MAX`] older than the new one starts over, which is upstream's "reset after 10 minutes":
//! a container that ran ten minutes before crashing again waits 10 s, not 5 min. Times are
//! passed in, so the rules are tested without sleeping.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// The first restart delay of a crashing container (`kubelet.go`: `backOffPeriod = 10s`).
pub const INITIAL: Duration = Duration::from_secs(10);

/// The longest restart delay (`kubelet.go`: `MaxContainerBackOff = 300s`). Longer delays a
/// fixed dependency's recovery; shorter spins a broken container and floods the events.
pub const MAX: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug)]
struct Entry {
    delay: Duration,
    last_failure: SystemTime,
}

/// Backoff entries by key.
#[derive(Debug, Default)]
pub struct Backoff {
    entries: HashMap<String, Entry>,
}

impl Backoff {
    /// An empty table.
    pub fn new() -> Backoff {
        Backoff::default()
    }

    /// Records a failure at `failed_at`; returns the delay now in force for `key`.
    pub fn next(&mut self, key: &str, failed_at: SystemTime) -> Duration {
        let delay = match self.entries.get(key) {
            Some(e) if !expired(e, failed_at) => (e.delay * 2).min(MAX),
            _ => INITIAL,
        };
        self.entries.insert(
            key.to_string(),
            Entry {
                delay,
                last_failure: failed_at,
            },
        );
        delay
    }

    /// How much longer `key` must wait at `now` after its failure at `failed_at`, or `None`
    /// when it may go (`IsInBackOffSince`).
    pub fn remaining(&self, key: &str, failed_at: SystemTime, now: SystemTime) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if expired(e, now) {
            return None;
        }
        let since = now.duration_since(failed_at).unwrap_or_default();
        e.delay.checked_sub(since).filter(|d| !d.is_zero())
    }

    /// The delay in force for `key` (for messages), if any.
    pub fn delay(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.delay)
    }

    /// When `key` last failed, if it did.
    pub fn last_failure(&self, key: &str) -> Option<SystemTime> {
        self.entries.get(key).map(|e| e.last_failure)
    }

    /// Forgets every key starting with `prefix` (a pod's keys once it is gone).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

/// Upstream's `hasExpired`: the last failure is more than `2 * MAX` before `at`.
fn expired(e: &Entry, at: SystemTime) -> bool {
    at.duration_since(e.last_failure)
        .is_ok_and(|since| since > MAX * 2)
}

/// The key of a container's restart backoff: upstream's `GetStableKey` (pod name, namespace,
/// uid, container name and spec hash), so a changed container starts with no backoff.
pub fn container_key(uid: &str, container: &str, hash: &str) -> String {
    format!("{uid}/container/{container}/{hash}")
}

/// The key of an image pull's backoff for one pod (`image_manager.go`: pod uid + image).
pub fn image_key(uid: &str, image: &str) -> String {
    format!("{uid}/image/{image}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn doubles_from_ten_seconds_to_five_minutes() {
        let mut b = Backoff::new();
        let mut t = 0;
        let mut delays = Vec::new();
        for _ in 0..8 {
            let d = b.next("k", at(t));
            delays.push(d.as_secs());
            t += d.as_secs() + 1;
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn waits_out_the_delay_from_the_failure() {
        let mut b = Backoff::new();
        assert_eq!(b.remaining("k", at(0), at(0)), None, "no failure yet");
        b.next("k", at(0));
        assert_eq!(b.remaining("k", at(0), at(3)), Some(Duration::from_secs(7)));
        assert_eq!(b.remaining("k", at(0), at(10)), None);
        b.next("k", at(11));
        assert_eq!(
            b.remaining("k", at(11), at(12)),
            Some(Duration::from_secs(19))
        );
    }

    #[test]
    fn resets_after_ten_minutes_without_failure() {
        let mut b = Backoff::new();
        b.next("k", at(0));
        b.next("k", at(20));
        assert_eq!(b.next("k", at(60)), Duration::from_secs(40));
        // Ran (or waited) 10 minutes and one second since the last failure: starts over.
        assert_eq!(b.next("k", at(60 + 601)), INITIAL);
        // Exactly 10 minutes is not past it.
        assert_eq!(b.next("k", at(60 + 601 + 600)), Duration::from_secs(20));
    }

    #[test]
    fn keys_are_separate_and_forgotten_per_pod() {
        let mut b = Backoff::new();
        let a = container_key("u1", "app", "h");
        let c = container_key("u2", "app", "h");
        b.next(&a, at(0));
        b.next(&a, at(11));
        assert_eq!(b.next(&c, at(12)), INITIAL);
        b.forget_prefix("u1/");
        assert_eq!(b.delay(&a), None);
        assert_eq!(b.delay(&c), Some(INITIAL));
    }
}
