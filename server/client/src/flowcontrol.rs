//! client-go's token-bucket rate limiter (`flowcontrol.NewTokenBucketRateLimiter`): `qps`
//! tokens a second, at most `burst` saved up. The client waits for a token before every
//! request; the workqueue's overall limiter asks how long until the next token.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// client-go's `rest.Config` default QPS: 5 requests a second per client.
pub const DEFAULT_QPS: f64 = 5.0;
/// client-go's default burst: 10 requests at once before the QPS applies.
pub const DEFAULT_BURST: u32 = 10;

/// A token bucket. Reservations are taken in order: each caller is told how long to wait for
/// its token, and the bucket goes negative for tokens promised but not yet refilled.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps <= 0` means unlimited.
    pub fn new(qps: f64, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps,
            burst,
            state: Mutex::new(BucketState {
                tokens: burst,
                last: Instant::now(),
            }),
        }
    }

    /// Takes one token now and returns how long the caller must wait before using it.
    pub fn reserve(&self) -> Duration {
        self.reserve_at(Instant::now())
    }

    fn reserve_at(&self, now: Instant) -> Duration {
        if self.qps <= 0.0 || !self.qps.is_finite() {
            return Duration::ZERO;
        }
        let mut s = self.state.lock();
        let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
        s.tokens = (s.tokens + elapsed * self.qps).min(self.burst);
        s.last = now;
        s.tokens -= 1.0;
        if s.tokens >= 0.0 {
            Duration::ZERO
        } else {
            // A vanishing QPS asks for a wait past what a Duration holds: the longest one.
            Duration::try_from_secs_f64(-s.tokens / self.qps).unwrap_or(Duration::MAX)
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let b = TokenBucket::new(10.0, 100);
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(b.reserve_at(now), Duration::ZERO);
        }
        // The 101st token is 1/10 s away, the 102nd 2/10 s.
        let w1 = b.reserve_at(now);
        let w2 = b.reserve_at(now);
        assert!((w1.as_secs_f64() - 0.1).abs() < 1e-9, "{w1:?}");
        assert!((w2.as_secs_f64() - 0.2).abs() < 1e-9, "{w2:?}");
        // A second later, ten tokens came back, two of them already promised.
        let later = now + Duration::from_secs(1);
        for _ in 0..8 {
            assert_eq!(b.reserve_at(later), Duration::ZERO);
        }
        assert!(b.reserve_at(later) > Duration::ZERO);
    }

    #[test]
    fn unlimited() {
        let b = TokenBucket::new(0.0, 1);
        for _ in 0..1000 {
            assert_eq!(b.reserve(), Duration::ZERO);
        }
    }

    #[test]
    fn a_vanishing_rate_waits_the_longest_not_panics() {
        let b = TokenBucket::new(1e-300, 1);
        let now = Instant::now();
        assert_eq!(b.reserve_at(now), Duration::ZERO);
        assert_eq!(b.reserve_at(now), Duration::MAX);
    }
}
