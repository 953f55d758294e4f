//! How long a failed key waits before it is retried: client-go's `workqueue` rate limiters.
//!
//! A controller that fails to sync a key calls [`WorkQueue::add_rate_limited`], which asks the
//! queue's [`RateLimiter`] for a delay and hands the key to the delaying heap. The default,
//! [`default_controller_rate_limiter`], is client-go's `DefaultTypedControllerRateLimiter`: the
//! larger of a per-item exponential backoff (one broken object backs off alone) and an overall
//! token bucket (a mass failure, say the apiserver restarting, cannot turn every key into a
//! retry storm).
//!
//! Invariant: only [`RateLimiter::when`] counts a failure; [`RateLimiter::forget`] is the only
//! way a count goes down, and it goes to zero.
//!
//! [`WorkQueue::add_rate_limited`]: super::WorkQueue::add_rate_limited

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;

use crate::flowcontrol::TokenBucket;

/// First retry delay of the per-item limiter: client-go's `DefaultTypedControllerRateLimiter`
/// uses 5 ms, short enough that a conflict on update (the usual failure) is retried at once,
/// and doubling reaches a second after 8 failures.
pub const DEFAULT_ITEM_BASE_DELAY: Duration = Duration::from_millis(5);
/// Cap of the per-item limiter: client-go's 1000 s (about 17 minutes). A key this broken is
/// retried a few times an hour, not forgotten; the resync or the next change still reaches it.
pub const DEFAULT_ITEM_MAX_DELAY: Duration = Duration::from_secs(1000);
/// Overall retry rate of the default limiter: client-go's 10 per second ("only limits retries,
/// not the first add"), so that a mass failure drains at a rate the apiserver shrugs off.
pub const DEFAULT_OVERALL_QPS: f64 = 10.0;
/// Overall retry burst of the default limiter: client-go's 100, so a handful of failing keys
/// never feel the bucket at all; only a storm of more than 100 quick retries is paced.
pub const DEFAULT_OVERALL_BURST: u32 = 100;

/// Decides how long an item waits before it is retried (client-go's `TypedRateLimiter`).
pub trait RateLimiter<T>: Send + Sync {
    /// The delay before `item` may be retried, counting this as one more failure.
    fn when(&self, item: &T) -> Duration;
    /// Forgets `item`'s failures: its next delay starts from the beginning.
    fn forget(&self, item: &T);
    /// How many failures of `item` are being counted.
    fn num_requeues(&self, item: &T) -> u32;
}

impl<T, L: RateLimiter<T> + ?Sized> RateLimiter<T> for Box<L> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }
    fn forget(&self, item: &T) {
        (**self).forget(item)
    }
    fn num_requeues(&self, item: &T) -> u32 {
        (**self).num_requeues(item)
    }
}

/// `base * 2^failures`, capped at `max` (client-go's `ItemExponentialFailureRateLimiter`).
/// The doubling saturates at `max` instead of overflowing, however many failures there were.
#[derive(Debug)]
pub struct ItemExponentialFailureRateLimiter<T> {
    base_delay: Duration,
    max_delay: Duration,
    /// Failures per item. A `parking_lot::Mutex` because every use is a single map lookup or
    /// update, never held across an `.await`.
    failures: Mutex<HashMap<T, u32>>,
}

impl<T: Hash + Eq + Clone> ItemExponentialFailureRateLimiter<T> {
    /// A limiter whose first delay is `base_delay` and whose delays never exceed `max_delay`.
    pub fn new(base_delay: Duration, max_delay: Duration) -> Self {
        ItemExponentialFailureRateLimiter {
            base_delay,
            max_delay,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// The delay after `failures` earlier failures: `base * 2^failures`, at most `max`.
    fn delay_after(&self, failures: u32) -> Duration {
        let Some(factor) = 1u32.checked_shl(failures) else {
            return self.max_delay;
        };
        self.base_delay
            .checked_mul(factor)
            .map_or(self.max_delay, |delay| delay.min(self.max_delay))
    }
}

impl<T: Hash + Eq + Clone + Send> RateLimiter<T> for ItemExponentialFailureRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        let mut failures = self.failures.lock();
        let count = failures.entry(item.clone()).or_insert(0);
        let earlier = *count;
        *count = count.saturating_add(1);
        self.delay_after(earlier)
    }

    fn forget(&self, item: &T) {
        self.failures.lock().remove(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.failures.lock().get(item).copied().unwrap_or(0)
    }
}

/// One token bucket shared by every item (client-go's `TypedBucketRateLimiter` over
/// `rate.Limiter`): each retry reserves the next token and waits until it is due. It counts
/// no per-item failures, so `num_requeues` is always 0.
#[derive(Debug)]
pub struct BucketRateLimiter {
    bucket: TokenBucket,
}

impl BucketRateLimiter {
    /// A bucket refilling `qps` tokens a second and holding at most `burst`.
    pub fn new(qps: f64, burst: u32) -> Self {
        BucketRateLimiter {
            bucket: TokenBucket::new(qps, burst),
        }
    }
}

impl<T> RateLimiter<T> for BucketRateLimiter {
    fn when(&self, _item: &T) -> Duration {
        self.bucket.reserve()
    }
    fn forget(&self, _item: &T) {}
    fn num_requeues(&self, _item: &T) -> u32 {
        0
    }
}

/// The longest delay of several limiters (client-go's `TypedMaxOfRateLimiter`). Every limiter
/// is asked on every `when`, so each keeps counting (and the bucket keeps reserving) even when
/// another one wins.
pub struct MaxOfRateLimiter<T> {
    limiters: Vec<Box<dyn RateLimiter<T>>>,
}

impl<T> MaxOfRateLimiter<T> {
    /// The maximum of `limiters`; with none, every delay is zero.
    pub fn new(limiters: Vec<Box<dyn RateLimiter<T>>>) -> Self {
        MaxOfRateLimiter { limiters }
    }
}

impl<T> std::fmt::Debug for MaxOfRateLimiter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaxOfRateLimiter")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

impl<T> RateLimiter<T> for MaxOfRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        self.limiters
            .iter()
            .map(|limiter| limiter.when(item))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    fn forget(&self, item: &T) {
        for limiter in &self.limiters {
            limiter.forget(item);
        }
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.limiters
            .iter()
            .map(|limiter| limiter.num_requeues(item))
            .max()
            .unwrap_or(0)
    }
}

/// client-go's `DefaultTypedControllerRateLimiter`: the larger of a per-item exponential
/// backoff from [`DEFAULT_ITEM_BASE_DELAY`] to [`DEFAULT_ITEM_MAX_DELAY`] and an overall bucket
/// of [`DEFAULT_OVERALL_QPS`] with burst [`DEFAULT_OVERALL_BURST`].
pub fn default_controller_rate_limiter<T>() -> MaxOfRateLimiter<T>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
{
    MaxOfRateLimiter::new(vec![
        Box::new(ItemExponentialFailureRateLimiter::new(
            DEFAULT_ITEM_BASE_DELAY,
            DEFAULT_ITEM_MAX_DELAY,
        )),
        Box::new(BucketRateLimiter::new(
            DEFAULT_OVERALL_QPS,
            DEFAULT_OVERALL_BURST,
        )),
    ])
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A limiter that always answers the same delay and counts its calls.
    struct Fixed {
        delay: Duration,
        calls: Mutex<u32>,
    }

    impl RateLimiter<&'static str> for Fixed {
        fn when(&self, _item: &&'static str) -> Duration {
            *self.calls.lock() += 1;
            self.delay
        }
        fn forget(&self, _item: &&'static str) {
            *self.calls.lock() = 0;
        }
        fn num_requeues(&self, _item: &&'static str) -> u32 {
            *self.calls.lock()
        }
    }

    #[test]
    fn exponential_doubles_from_the_base() {
        let limiter = ItemExponentialFailureRateLimiter::new(ms(5), Duration::from_secs(1000));
        let delays: Vec<Duration> = (0..5).map(|_| limiter.when(&"a")).collect();
        assert_eq!(delays, vec![ms(5), ms(10), ms(20), ms(40), ms(80)]);
        assert_eq!(limiter.num_requeues(&"a"), 5);
        // Another item has its own count.
        assert_eq!(limiter.when(&"b"), ms(5));
        assert_eq!(limiter.num_requeues(&"b"), 1);
    }

    #[test]
    fn exponential_caps_and_saturates() {
        let limiter = ItemExponentialFailureRateLimiter::new(ms(5), Duration::from_secs(1000));
        // 5 ms * 2^17 = 655 s, 2^18 = 1310 s > cap.
        let delays: Vec<Duration> = (0..19).map(|_| limiter.when(&"a")).collect();
        assert_eq!(delays[17], ms(5 * (1 << 17)));
        assert_eq!(delays[18], Duration::from_secs(1000));
        // Far past the point where 2^failures overflows u32 and Duration: still the cap.
        for _ in 0..100 {
            assert_eq!(limiter.when(&"a"), Duration::from_secs(1000));
        }
        assert_eq!(limiter.num_requeues(&"a"), 119);
        assert_eq!(limiter.delay_after(u32::MAX), Duration::from_secs(1000));
    }

    #[test]
    fn exponential_forget_starts_over() {
        let limiter = ItemExponentialFailureRateLimiter::new(ms(5), ms(1000));
        limiter.when(&"a");
        limiter.when(&"a");
        limiter.when(&"b");
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.when(&"a"), ms(5));
        // Forgetting one item leaves the others alone.
        assert_eq!(limiter.when(&"b"), ms(10));
    }

    #[test]
    fn bucket_paces_after_the_burst() {
        let limiter = BucketRateLimiter::new(10.0, 3);
        for _ in 0..3 {
            assert_eq!(RateLimiter::<&str>::when(&limiter, &"a"), Duration::ZERO);
        }
        // The fourth token is a tenth of a second away (less the few microseconds elapsed).
        let wait = RateLimiter::<&str>::when(&limiter, &"b");
        assert!(wait > ms(90) && wait <= ms(100), "{wait:?}");
        assert_eq!(RateLimiter::<&str>::num_requeues(&limiter, &"a"), 0);
    }

    #[test]
    fn max_of_takes_the_longest_and_asks_everyone() {
        let short = Box::new(Fixed {
            delay: ms(1),
            calls: Mutex::new(0),
        });
        let long = Box::new(Fixed {
            delay: ms(7),
            calls: Mutex::new(0),
        });
        let limiter = MaxOfRateLimiter::<&'static str>::new(vec![short, long]);
        assert_eq!(limiter.when(&"a"), ms(7));
        assert_eq!(limiter.when(&"a"), ms(7));
        // Both limiters counted both failures.
        assert_eq!(limiter.num_requeues(&"a"), 2);
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(
            MaxOfRateLimiter::<&str>::new(vec![]).when(&"a"),
            Duration::ZERO
        );
    }

    #[test]
    fn default_is_exponential_until_the_bucket_empties() {
        let limiter = default_controller_rate_limiter::<&str>();
        // Within the burst of 100 the per-item backoff decides.
        assert_eq!(limiter.when(&"a"), ms(5));
        assert_eq!(limiter.when(&"a"), ms(10));
        assert_eq!(limiter.num_requeues(&"a"), 2);
        for _ in 0..98 {
            let _ = limiter.when(&"x");
        }
        // The bucket is empty now: a fresh item waits about 1/10 s, not 5 ms.
        let wait = limiter.when(&"fresh");
        assert!(wait > ms(50), "{wait:?}");
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
    }
}
