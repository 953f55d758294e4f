//! Retrying a write that lost a race with another writer: client-go's `util/retry`
//! (`RetryOnConflict(DefaultRetry, fn)`, `OnError`, `DefaultBackoff`), the wrapper of every
//! controller's read-modify-write.
//!
//! The schedule and the loop are `skerry_api::retry`, re-exported here: the apiserver's own
//! eviction subresource retries with the same code (Kubernetes' does with client-go's), and
//! it does not depend on this crate. This module teaches them the client's [`Error`]: a 409
//! whose reason is `Conflict` (not `AlreadyExists`) is a conflict, and so is an
//! [`anyhow::Error`] that wraps one ([`is_conflict`], for operations whose errors carry
//! context).
//!
//! This is not the transport's retry of answers the server did not process (a 429 or 5xx
//! with `Retry-After`, client-go's `rest/request.go`), which [`crate::api`] does on every
//! request: that one repeats the same request, this one a whole read-modify-write.
//!
//! ```text
//! let mut attempt = 0;
//! retry_on_conflict(DEFAULT_RETRY, || {
//!     attempt += 1;
//!     let fresh = attempt > 1;
//!     async move {
//!         let mut object = if fresh { api.get(name).await? } else { cached.clone() };
//!         object.status = Some(status.clone());
//!         api.replace_status(name, &PostParams::default(), &object).await
//!     }
//! })
//! .await
//! ```
//!
//! A run that lost the race learns the winner's object by reading it again at the start of
//! the next run, as client-go's callers do; the closure counts its runs to skip that read
//! the first time, when the cached copy is the best guess.

pub use skerry_api::retry::{
    Backoff, Conflict, DEFAULT_BACKOFF, DEFAULT_RETRY, on_error, retry_on_conflict,
};

use crate::Error;

impl Conflict for Error {
    fn is_conflict(&self) -> bool {
        Error::is_conflict(self)
    }
}

/// Whether `error` is, or wraps with context, the client's Conflict: the predicate for
/// [`on_error`] when the operation's errors are `anyhow::Error`.
pub fn is_conflict(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<Error>()
        .is_some_and(Error::is_conflict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;
    use tokio::time::Instant;

    fn status(code: i32, reason: &str) -> Error {
        Error::Api(Box::new(Status {
            code: Some(code),
            reason: Some(reason.into()),
            message: Some(format!("{reason} ({code})")),
            ..Status::default()
        }))
    }

    /// Runs `retry_on_conflict(DEFAULT_RETRY)` over an operation failing with `error()` every
    /// time; returns the runs and the time waited on the paused clock.
    async fn runs_until_given_up(error: impl Fn() -> Error) -> (u32, Duration, Error) {
        let runs = AtomicU32::new(0);
        let start = Instant::now();
        let result: Result<(), Error> = retry_on_conflict(DEFAULT_RETRY, || {
            runs.fetch_add(1, Ordering::SeqCst);
            let e = error();
            async move { Err(e) }
        })
        .await;
        (
            runs.load(Ordering::SeqCst),
            start.elapsed(),
            result.expect_err("never succeeds"),
        )
    }

    // Only a 409 Conflict is retried: client-go's `errors.IsConflict`. An AlreadyExists is a
    // 409 too, but reading again cannot fix it; a 500 or a transport error is for the
    // caller's own backoff (the work queue's), not this loop's.
    #[tokio::test(start_paused = true)]
    async fn only_a_conflict_is_retried_and_up_to_five_runs() {
        let (runs, waited, last) = runs_until_given_up(|| status(409, "Conflict")).await;
        assert_eq!(runs, 5, "DefaultRetry's five steps");
        assert!(last.is_conflict());
        assert!(
            waited >= Duration::from_millis(40) && waited <= Duration::from_millis(44),
            "four pauses of 10 ms + up to 10 %: {waited:?}"
        );
        let others: [fn() -> Error; 4] = [
            || status(409, "AlreadyExists"),
            || status(500, "InternalError"),
            || status(404, "NotFound"),
            || Error::Transport("connection refused".into()),
        ];
        for other in others {
            let (runs, waited, last) = runs_until_given_up(other).await;
            assert_eq!((runs, waited), (1, Duration::ZERO), "{last}");
            assert_eq!(last.to_string(), other().to_string());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_then_success_reads_again_once() {
        let runs = AtomicU32::new(0);
        let value = retry_on_conflict(DEFAULT_RETRY, || {
            let n = runs.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Err(status(409, "Conflict"))
                } else {
                    Ok(n)
                }
            }
        })
        .await
        .expect("the second run succeeds");
        assert_eq!(value, 1);
    }

    #[test]
    fn conflicts_are_recognised_through_context() {
        let wrapped = Err::<(), _>(status(409, "Conflict"))
            .context("update the status")
            .unwrap_err();
        assert!(is_conflict(&wrapped));
        let other = Err::<(), _>(status(409, "AlreadyExists"))
            .context("create")
            .unwrap_err();
        assert!(!is_conflict(&other));
        assert!(!is_conflict(&anyhow::anyhow!(
            "uid has changed across retries"
        )));
    }
}
