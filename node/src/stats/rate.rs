//! `usageNanoCores`: CPU use as a rate, from two samples of a cumulative counter
//! (cAdvisor's housekeeping keeps each container's previous sample and derives the
//! instantaneous usage from the last two; the kubelet's `getCPUStats` reports it).
//!
//! [`Rates`] keeps the previous sample per key (a cgroup name or a container id). A sample
//! closer than [`MIN_RATE_WINDOW`] to the kept one does not replace it, so a scrape right
//! after the housekeeping pass still divides by a window long enough to mean something; a
//! counter that went backwards (a container restarted under the same key) restarts the
//! window.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The shortest window a rate is computed over (cAdvisor's rates come from samples one
/// housekeeping interval apart; a scrape between two passes must not divide by microseconds).
pub const MIN_RATE_WINDOW: Duration = Duration::from_secs(1);

/// One reading of a cumulative CPU counter: when (ns since the epoch) and how much (ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub at_ns: u64,
    pub usage_ns: u64,
}

/// Nanocores between two samples: CPU-ns used per ns of wall time, times 10^9. `None` when
/// the window is empty or the counter went backwards.
pub fn nano_cores(prev: Sample, now: Sample) -> Option<u64> {
    let dt = now.at_ns.checked_sub(prev.at_ns).filter(|d| *d > 0)?;
    let used = now.usage_ns.checked_sub(prev.usage_ns)?;
    u64::try_from(u128::from(used) * 1_000_000_000 / u128::from(dt)).ok()
}

#[derive(Debug)]
struct Entry {
    prev: Sample,
    rate: Option<u64>,
    /// Marked by each sweep; entries not seen in one are dropped.
    seen: bool,
}

/// The previous sample and last rate per key.
#[derive(Debug, Default)]
pub struct Rates {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Rates {
    /// Records `now` for `key` and returns the current rate, if two samples far enough apart
    /// exist.
    pub fn observe(&self, key: &str, now: Sample) -> Option<u64> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Some(e) = entries.get_mut(key) else {
            entries.insert(
                key.to_string(),
                Entry {
                    prev: now,
                    rate: None,
                    seen: true,
                },
            );
            return None;
        };
        e.seen = true;
        if now.usage_ns < e.prev.usage_ns || now.at_ns < e.prev.at_ns {
            *e = Entry {
                prev: now,
                rate: None,
                seen: true,
            };
            return None;
        }
        if Duration::from_nanos(now.at_ns - e.prev.at_ns) >= MIN_RATE_WINDOW {
            e.rate = nano_cores(e.prev, now);
            e.prev = now;
        }
        e.rate
    }

    /// Drops the keys not observed since the last call (containers and pods gone).
    pub fn sweep(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|_, e| std::mem::take(&mut e.seen));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn half_a_core_over_two_seconds() {
        let a = Sample {
            at_ns: 10 * S,
            usage_ns: 5 * S,
        };
        let b = Sample {
            at_ns: 12 * S,
            usage_ns: 6 * S,
        };
        assert_eq!(nano_cores(a, b), Some(500_000_000));
        assert_eq!(nano_cores(b, a), None, "time went backwards");
        assert_eq!(nano_cores(a, a), None, "an empty window");
    }

    #[test]
    fn the_previous_sample_is_kept_until_the_window_is_long_enough() {
        let r = Rates::default();
        assert_eq!(
            r.observe(
                "pod",
                Sample {
                    at_ns: 0,
                    usage_ns: 0
                }
            ),
            None
        );
        // 100 ms later: too close, no rate and the first sample stays.
        assert_eq!(
            r.observe(
                "pod",
                Sample {
                    at_ns: S / 10,
                    usage_ns: S / 10
                }
            ),
            None
        );
        // 2 s after the first: two cores over the whole window.
        assert_eq!(
            r.observe(
                "pod",
                Sample {
                    at_ns: 2 * S,
                    usage_ns: 4 * S
                }
            ),
            Some(2 * S)
        );
        // A quick second scrape keeps reporting the last rate.
        assert_eq!(
            r.observe(
                "pod",
                Sample {
                    at_ns: 2 * S + 1,
                    usage_ns: 4 * S
                }
            ),
            Some(2 * S)
        );
        // A restarted counter starts over.
        assert_eq!(
            r.observe(
                "pod",
                Sample {
                    at_ns: 3 * S,
                    usage_ns: 1
                }
            ),
            None
        );
        r.sweep();
        r.sweep();
        assert_eq!(
            r.observe(
                "pod",
                Sample {
                    at_ns: 9 * S,
                    usage_ns: 9
                }
            ),
            None,
            "swept"
        );
    }
}
