//! Retrying an operation that lost a race: client-go's `k8s.io/client-go/util/retry`
//! (`RetryOnConflict`, `OnError`, `DefaultRetry`, `DefaultBackoff`) over apimachinery's
//! `wait.Backoff` (`k8s.io/apimachinery/pkg/util/wait/backoff.go`: `Step`,
//! `ExponentialBackoff`).
//!
//! It lives here, below both the client library and the apiserver, because Kubernetes uses it
//! on both sides: controllers wrap their read-modify-write of an object in it, and the
//! apiserver's own eviction subresource wraps its pod and budget writes in it
//! (`EvictionsRetry`). `skerry_client::retry` re-exports it and teaches it the client's error.
//!
//! The schedule is `wait.Backoff`'s: the operation runs at most `steps` times; between two
//! runs the caller sleeps `duration`, which is then multiplied by `factor` (and held at `cap`,
//! where reaching the cap also ends the schedule after that sleep), each sleep stretched by
//! up to `jitter` of itself at random. Only errors the caller calls retriable are retried;
//! any other error, and the last retriable one once the steps run out, is returned as is.

use std::future::Future;
use std::time::Duration;

use crate::status::ApiError;

/// A retry schedule (apimachinery's `wait.Backoff`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// The first pause.
    pub duration: Duration,
    /// What each pause is multiplied by for the next one (0 or 1: constant).
    pub factor: f64,
    /// Each pause is stretched by a random share of itself up to this (0: none).
    pub jitter: f64,
    /// Runs of the operation at most. An operation always runs once, even with 0 (Go's
    /// `ExponentialBackoff` would not run it at all, and `OnError` then returns no error).
    pub steps: u32,
    /// The longest pause before jitter (zero: no cap). Reaching it ends the schedule.
    pub cap: Duration,
}

/// client-go's `retry.DefaultRetry`, for conflicts on a contended object: five runs 10 ms
/// apart with 10 % jitter. "The default retry backoff should be used when retrying on
/// conflicts between two writers": a conflict means another writer just won, so a short
/// constant pause is enough, and five attempts are far past any ordinary race.
pub const DEFAULT_RETRY: Backoff = Backoff {
    duration: Duration::from_millis(10),
    factor: 1.0,
    jitter: 0.1,
    steps: 5,
    cap: Duration::ZERO,
};

/// client-go's `retry.DefaultBackoff`, for operations that depend on something outside the
/// race (another controller, a slow server): four runs, pauses 10 ms, 50 ms, 250 ms (factor
/// 5) with 10 % jitter, about 310 ms in all.
pub const DEFAULT_BACKOFF: Backoff = Backoff {
    duration: Duration::from_millis(10),
    factor: 5.0,
    jitter: 0.1,
    steps: 4,
    cap: Duration::ZERO,
};

impl Backoff {
    /// `steps` runs with no pause between them: the shape of Kubernetes' hand-rolled retries
    /// that read again and write at once (the ReplicaSet and DaemonSet controllers'
    /// `statusUpdateRetries`).
    pub const fn immediate(steps: u32) -> Backoff {
        Backoff {
            duration: Duration::ZERO,
            factor: 1.0,
            jitter: 0.0,
            steps,
            cap: Duration::ZERO,
        }
    }

    /// The next pause, advancing the schedule (`wait.Backoff.Step`).
    pub fn step(&mut self) -> Duration {
        self.step_with(rand::random::<f64>())
    }

    /// [`Self::step`] with the random draw in `[0, 1)` given (for tests).
    pub fn step_with(&mut self, random: f64) -> Duration {
        if self.steps < 1 {
            return jittered(self.duration, self.jitter, random);
        }
        self.steps -= 1;
        let pause = self.duration;
        if self.factor != 0.0 {
            self.duration = scale(self.duration, self.factor);
            if !self.cap.is_zero() && self.duration > self.cap {
                self.duration = self.cap;
                self.steps = 0;
            }
        }
        jittered(pause, self.jitter, random)
    }
}

/// `duration * factor`, truncated to whole nanoseconds as Go's `time.Duration(float64(d) * f)`.
fn scale(duration: Duration, factor: f64) -> Duration {
    // A float-to-integer `as` saturates, so a runaway factor caps at ~584 years.
    Duration::from_nanos((duration.as_nanos() as f64 * factor) as u64)
}

/// `wait.Jitter`: `duration + random * jitter * duration`.
fn jittered(duration: Duration, jitter: f64, random: f64) -> Duration {
    if jitter <= 0.0 {
        return duration;
    }
    duration + scale(duration, random * jitter)
}

/// An error that can say whether it is a 409 Conflict: the write lost a race with another
/// writer (a stale `resourceVersion`), and reading again and retrying may succeed.
pub trait Conflict {
    /// Whether this is a Conflict (Kubernetes' `errors.IsConflict`).
    fn is_conflict(&self) -> bool;
}

impl Conflict for ApiError {
    fn is_conflict(&self) -> bool {
        self.code == 409 && self.reason == "Conflict"
    }
}

/// Runs `operation` (an async closure: `|| async { ... }`) until it succeeds, returns an
/// error `retriable` refuses, or the schedule's steps run out, sleeping the schedule's pause
/// between runs (client-go's `retry.OnError`). The error returned is the last one.
///
/// Each run gets a fresh future, so an operation re-reads what it writes at the start of a
/// retry (client-go's idiom); what a run learns for the next one goes through state the
/// closure itself updates when it is called.
pub async fn on_error<T, E, F, Fut>(
    backoff: Backoff,
    retriable: impl Fn(&E) -> bool,
    mut operation: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = backoff;
    loop {
        let error = match operation().await {
            Ok(value) => return Ok(value),
            Err(e) if !retriable(&e) => return Err(e),
            Err(e) => e,
        };
        if backoff.steps <= 1 {
            return Err(error);
        }
        tokio::time::sleep(backoff.step()).await;
        if backoff.steps == 0 {
            // The cap was reached: `ExponentialBackoff` stops after this sleep.
            return Err(error);
        }
    }
}

/// [`on_error`] retrying only conflicts (client-go's `retry.RetryOnConflict`): the usual
/// wrapper of a read-modify-write against the apiserver, with [`DEFAULT_RETRY`].
pub async fn retry_on_conflict<T, E, F, Fut>(backoff: Backoff, operation: F) -> Result<T, E>
where
    E: Conflict,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    on_error(backoff, E::is_conflict, operation).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::time::Instant;

    /// Every pause of a schedule, with the random draw pinned.
    fn pauses(mut backoff: Backoff, random: f64) -> Vec<Duration> {
        let mut out = Vec::new();
        while backoff.steps > 1 {
            out.push(backoff.step_with(random));
        }
        out
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    // Reference: apimachinery wait/backoff.go `Step` and client-go retry/util.go.
    #[test]
    fn the_schedules_are_client_gos() {
        // DefaultRetry: four pauses of 10 ms between five runs, up to 10 % more.
        assert_eq!(pauses(DEFAULT_RETRY, 0.0), vec![ms(10); 4]);
        assert_eq!(
            pauses(DEFAULT_RETRY, 0.5),
            vec![ms(10) + Duration::from_micros(500); 4]
        );
        // DefaultBackoff: 10, 50, 250 ms between four runs.
        assert_eq!(pauses(DEFAULT_BACKOFF, 0.0), vec![ms(10), ms(50), ms(250)]);
        // Jitter never shortens a pause and stays under (1 + jitter) times it.
        for random in [0.0, 0.25, 0.999] {
            for (pause, base) in pauses(DEFAULT_BACKOFF, random)
                .into_iter()
                .zip([10, 50, 250])
            {
                assert!(
                    pause >= ms(base) && pause < ms(base).mul_f64(1.1),
                    "{pause:?}"
                );
            }
        }
        // A cap holds the pause and ends the schedule.
        let mut capped = Backoff {
            cap: ms(30),
            steps: 10,
            factor: 2.0,
            jitter: 0.0,
            duration: ms(10),
        };
        assert_eq!(capped.step_with(0.0), ms(10));
        assert_eq!(capped.steps, 9);
        // The next pause would be 40 ms: held at 30 ms, and the schedule ends.
        assert_eq!(capped.step_with(0.0), ms(20));
        assert_eq!(capped.steps, 0, "reaching the cap ends the schedule");
        // Past the last step the pause stays at the cap.
        assert_eq!(capped.step_with(0.0), ms(30));
        assert_eq!(capped.step_with(0.0), ms(30));
    }

    #[derive(Debug, PartialEq)]
    enum Failure {
        Conflict(u32),
        Other(u32),
    }

    impl Conflict for Failure {
        fn is_conflict(&self) -> bool {
            matches!(self, Failure::Conflict(_))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn conflicts_are_retried_until_the_step_limit_and_the_last_error_is_returned() {
        let runs = AtomicU32::new(0);
        let start = Instant::now();
        let result: Result<(), Failure> = retry_on_conflict(DEFAULT_RETRY, || async {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            Err(Failure::Conflict(n))
        })
        .await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            5,
            "DefaultRetry has five steps"
        );
        assert_eq!(result, Err(Failure::Conflict(5)), "the last error");
        // Four pauses of 10 ms plus at most 10 % jitter each, on the paused clock.
        let waited = start.elapsed();
        assert!(waited >= ms(40) && waited <= ms(44), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn only_conflicts_are_retried() {
        let runs = AtomicU32::new(0);
        let start = Instant::now();
        let result: Result<(), Failure> = retry_on_conflict(DEFAULT_RETRY, || async {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if n < 3 {
                Err(Failure::Conflict(n))
            } else {
                Err(Failure::Other(n))
            }
        })
        .await;
        assert_eq!(
            result,
            Err(Failure::Other(3)),
            "returned at once, not retried"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert!(start.elapsed() <= ms(22));
        // A success after a conflict ends the retries.
        let runs = AtomicU32::new(0);
        let value = retry_on_conflict(DEFAULT_RETRY, || async {
            match runs.fetch_add(1, Ordering::SeqCst) {
                0 => Err(Failure::Conflict(1)),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!(value, Ok(1));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn on_error_retries_what_the_predicate_allows_and_runs_at_least_once() {
        let runs = AtomicU32::new(0);
        let once = Backoff {
            steps: 0,
            ..DEFAULT_RETRY
        };
        let result: Result<(), u32> = on_error(
            once,
            |_| true,
            || async { Err(runs.fetch_add(1, Ordering::SeqCst)) },
        )
        .await;
        assert_eq!(result, Err(0));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // Any error, twice, with no pause: the shape of the ReplicaSet controller's status
        // write (`statusUpdateRetries`).
        let runs = AtomicU32::new(0);
        let start = Instant::now();
        let result: Result<(), u32> = on_error(
            Backoff::immediate(2),
            |_| true,
            || async { Err(runs.fetch_add(1, Ordering::SeqCst)) },
        )
        .await;
        assert_eq!(result, Err(1));
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn api_conflicts_are_409_conflict_only() {
        assert!(ApiError::conflict("", "pods", "p", "stale").is_conflict());
        assert!(!ApiError::already_exists("", "pods", "p").is_conflict());
        assert!(!ApiError::bad_request("x").is_conflict());
    }
}
