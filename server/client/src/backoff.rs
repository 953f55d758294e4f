//! The reflector's backoff: client-go's exponential backoff manager with the reflector's numbers.
//!
//! `docs/tricks.md` #16 (the reflector withholding unearned resource versions, and its
//! backoff): the backoff's numbers come from traffic arithmetic, not feel. Every reflector of
//! every client retries through this struct, so its numbers decide how hard a fleet of clients
//! hits an apiserver that has just restarted. client-go's comment on the same numbers
//! (`tools/cache/reflector.go`, `NewNamedReflector`): retrying once a second was 1 QPS per
//! reflector; with these parameters the retry interval settles in [30, 60) s, about 0.022 QPS —
//! a ~98 % cut in traffic while the apiserver is unhealthy.
//!
//! Semantics (client-go's `exponentialBackoffManagerImpl` over `wait.Backoff.Step`):
//! - each [`Backoff::next_delay`] returns the current base delay stretched by jitter
//!   (`base * (1 + random * jitter)`, so in `[base, 2 * base)` with jitter 1.0), then multiplies
//!   the base by [`BACKOFF_FACTOR`], capped at [`BACKOFF_MAX`]. The cap bounds the *base*:
//!   with full jitter a single delay can reach twice the cap, as in client-go;
//! - if more than [`BACKOFF_RESET_AFTER`] passed since the previous call, the base starts over
//!   at [`BACKOFF_INITIAL`] first.
//!
//! The struct holds no clock: the caller passes `now` (a tokio [`Instant`], so tests under a
//! paused tokio clock drive it), and [`Backoff::next_delay_with_random`] takes the random draw
//! so tests can pin it.

use std::time::Duration;

use tokio::time::Instant;

/// The first retry delay. An apiserver restart disconnects every reflector of every client at
/// once (three controllers' worth of informers, each kubelet's, each proxy's: thousands on a
/// big cluster); if they all retried at once the first wave would land as one spike on a
/// server that is still warming its watch caches. 800 ms, stretched to [0.8, 1.6) s by jitter,
/// spreads that wave over most of two seconds while still reconnecting quickly after a blip.
/// From client-go (`NewNamedReflector`).
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(800);

/// The largest base delay. It bounds staleness: a reflector whose apiserver is down notices
/// that it is back at most ~30 s (60 s with jitter) later, and meanwhile sends about 0.022 QPS
/// instead of 1 QPS. Larger saves a little more traffic but leaves caches stale for longer
/// after recovery; smaller multiplies the load on a sick server. From client-go.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Quiet time after which the backoff starts over at [`BACKOFF_INITIAL`]. Two minutes is long
/// compared with any single delay (at most 60 s), so a flapping connection — fail, recover for
/// a minute, fail again — keeps backing off instead of hammering the server at 800 ms each
/// time; only a connection that stayed healthy for two minutes earns a fast retry again. From
/// client-go.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(2 * 60);

/// Growth per failure. Doubling reaches the cap in six steps (0.8 → 25.6 s), i.e. within about
/// a minute of cumulative waiting, which is as long as a restarting apiserver typically needs.
/// From client-go.
pub const BACKOFF_FACTOR: f64 = 2.0;

/// Jitter fraction: each delay is `base * (1 + random * BACKOFF_JITTER)`. A full 1.0 spreads a
/// synchronised wave of reflectors (all disconnected by the same restart, so all on the same
/// step) uniformly across a whole interval, `[base, 2 * base)`, instead of a narrow band that
/// would arrive as a spike. From client-go.
pub const BACKOFF_JITTER: f64 = 1.0;

// The numbers must keep their relations: the cap is reachable, and the reset period is longer
// than the largest possible single delay (cap * (1 + jitter)), or a reflector sleeping at the
// cap would be reset by its own sleep and never back off past it.
const _: () = assert!(BACKOFF_INITIAL.as_millis() < BACKOFF_MAX.as_millis());
const _: () = assert!(BACKOFF_RESET_AFTER.as_secs() > 2 * BACKOFF_MAX.as_secs());

/// An exponential backoff with jitter and a quiet-period reset (client-go's
/// `ExponentialBackoffManager`). Not shared: one per retry loop.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    reset_after: Duration,
    factor: f64,
    jitter: f64,
    /// The base of the next delay, before jitter.
    base: Duration,
    /// When the previous delay was handed out; `None` before the first.
    last_delay_at: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::reflector()
    }
}

impl Backoff {
    /// The reflector's backoff: client-go's numbers (see the constants).
    pub fn reflector() -> Backoff {
        Backoff::new(
            BACKOFF_INITIAL,
            BACKOFF_MAX,
            BACKOFF_RESET_AFTER,
            BACKOFF_FACTOR,
            BACKOFF_JITTER,
        )
    }

    /// A backoff starting at `initial`, multiplied by `factor` per call up to `max`, jittered by
    /// `jitter`, starting over after `reset_after` without calls.
    ///
    /// # Panics
    /// If `initial` is zero or above `max`, `factor` is below 1, or `jitter` is negative or not
    /// finite: those are programming errors, not operating conditions.
    pub fn new(
        initial: Duration,
        max: Duration,
        reset_after: Duration,
        factor: f64,
        jitter: f64,
    ) -> Backoff {
        assert!(!initial.is_zero(), "backoff initial delay must be positive");
        assert!(initial <= max, "backoff initial {initial:?} > max {max:?}");
        assert!(
            factor.is_finite() && factor >= 1.0,
            "backoff factor {factor} must be >= 1"
        );
        assert!(
            jitter.is_finite() && jitter >= 0.0,
            "backoff jitter {jitter} must be >= 0"
        );
        Backoff {
            initial,
            max,
            reset_after,
            factor,
            jitter,
            base: initial,
            last_delay_at: None,
        }
    }

    /// The delay before the next retry, after a failure at `now`.
    pub fn next_delay(&mut self, now: Instant) -> Duration {
        self.next_delay_with_random(now, rand::random::<f64>())
    }

    /// [`Self::next_delay`] with the random draw given (`random_unit` in `[0, 1)`; clamped).
    pub fn next_delay_with_random(&mut self, now: Instant, random_unit: f64) -> Duration {
        if let Some(last) = self.last_delay_at
            && now.saturating_duration_since(last) > self.reset_after
        {
            self.base = self.initial;
        }
        self.last_delay_at = Some(now);
        let base = self.base;
        self.base = base.mul_f64(self.factor).min(self.max);
        let random_unit = if random_unit.is_finite() {
            random_unit.clamp(0.0, 1.0)
        } else {
            0.0
        };
        base + base.mul_f64(random_unit * self.jitter)
    }

    /// Starts over at the initial delay.
    pub fn reset(&mut self) {
        self.base = self.initial;
        self.last_delay_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    #[test]
    fn doubles_from_800ms_to_the_30s_cap() {
        let mut b = Backoff::reflector();
        let start = Instant::now();
        let bases: Vec<u128> = (0..9)
            .map(|i| ms(b.next_delay_with_random(start + Duration::from_secs(i), 0.0)))
            .collect();
        assert_eq!(
            bases,
            vec![
                800, 1_600, 3_200, 6_400, 12_800, 25_600, 30_000, 30_000, 30_000
            ]
        );
    }

    #[test]
    fn jitter_stretches_each_delay_within_base_to_twice_base() {
        let start = Instant::now();
        // The extremes of the draw pin the bounds exactly.
        let mut low = Backoff::reflector();
        let mut high = Backoff::reflector();
        let mut expected_base = BACKOFF_INITIAL;
        for i in 0..10 {
            let now = start + Duration::from_secs(i);
            assert_eq!(low.next_delay_with_random(now, 0.0), expected_base);
            let d = high.next_delay_with_random(now, 0.999_999);
            assert!(
                d >= expected_base && d < expected_base * 2,
                "{d:?} vs {expected_base:?}"
            );
            expected_base = (expected_base * 2).min(BACKOFF_MAX);
        }
        // And real draws stay inside them.
        let mut real = Backoff::reflector();
        let mut expected_base = BACKOFF_INITIAL;
        for i in 0..20 {
            let d = real.next_delay(start + Duration::from_secs(i));
            assert!(d >= expected_base, "{d:?} < {expected_base:?}");
            assert!(d <= expected_base * 2, "{d:?} > 2 * {expected_base:?}");
            expected_base = (expected_base * 2).min(BACKOFF_MAX);
        }
    }

    #[test]
    fn resets_after_two_quiet_minutes_but_not_before() {
        let mut b = Backoff::reflector();
        let mut now = Instant::now();
        for _ in 0..5 {
            b.next_delay_with_random(now, 0.0);
            now += Duration::from_secs(1);
        }
        assert_eq!(ms(b.next_delay_with_random(now, 0.0)), 25_600);
        // Exactly two minutes of quiet is not "more than" two minutes: keep backing off.
        now += BACKOFF_RESET_AFTER;
        assert_eq!(ms(b.next_delay_with_random(now, 0.0)), 30_000);
        // A flapping connection (a failure every minute) never resets.
        for _ in 0..5 {
            now += Duration::from_secs(60);
            assert_eq!(ms(b.next_delay_with_random(now, 0.0)), 30_000);
        }
        // Two minutes and a millisecond of quiet: start over.
        now += BACKOFF_RESET_AFTER + Duration::from_millis(1);
        assert_eq!(ms(b.next_delay_with_random(now, 0.0)), 800);
        assert_eq!(ms(b.next_delay_with_random(now, 0.0)), 1_600);
    }

    #[test]
    fn explicit_reset_starts_over() {
        let mut b = Backoff::reflector();
        let now = Instant::now();
        b.next_delay_with_random(now, 0.0);
        b.next_delay_with_random(now, 0.0);
        b.reset();
        assert_eq!(b.next_delay_with_random(now, 0.0), BACKOFF_INITIAL);
    }

    #[test]
    fn out_of_range_draws_are_clamped() {
        let now = Instant::now();
        assert_eq!(
            Backoff::reflector().next_delay_with_random(now, 7.0),
            BACKOFF_INITIAL * 2
        );
        assert_eq!(
            Backoff::reflector().next_delay_with_random(now, -1.0),
            BACKOFF_INITIAL
        );
        assert_eq!(
            Backoff::reflector().next_delay_with_random(now, f64::NAN),
            BACKOFF_INITIAL
        );
    }
}
