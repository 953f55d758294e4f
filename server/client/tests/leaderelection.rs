//! Leader election (client-go's `tools/leaderelection`) on an in-memory lease with tokio's
//! paused clock, and over a real apiserver ([`TestServer`]).
//!
//! What the tests show: one leader at a time; a follower takes over a lease duration after
//! it last saw the record change when the leader dies, and at once when it releases; the
//! takeover wait is timed by the follower's own clock, whatever `renewTime` another machine
//! wrote (`docs/tricks.md` #14, leader election on observedTime); losing the
//! resourceVersion race is not leadership; failed renewals cancel the leader's token at the
//! renew deadline; and the clock-rate skew tolerated is `lease_duration / renew_deadline`.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::leaderelection::{
    Callbacks, Clock, ConfigError, DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD, JITTER_FACTOR, LeaderElectionConfig, LeaderElectionRecord, LeaderElector,
    LeaseApiLock, LeaseLock, MemoryLeaseLock, RateClock, RunOutcome,
};
use skerry_client::{Client, Error};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

/// The longest pause between two acquisition attempts: `retry_period * (1 + 1.2)`.
fn max_retry_wait() -> Duration {
    DEFAULT_RETRY_PERIOD.mul_f64(1.0 + JITTER_FACTOR)
}

/// A tolerance for "at the same instant" on the paused clock (timers fire on ms ticks).
const TICK: Duration = Duration::from_millis(5);

#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// `on_started_leading` ran.
    Started(Instant),
    /// The leader's token was cancelled (its work saw it).
    TokenCancelled(Instant),
    /// The leader's work returned; the lease holder at that moment.
    WorkEnded(Instant, Option<String>),
    /// `on_stopped_leading` ran.
    Stopped(Instant),
    /// `on_new_leader`.
    NewLeader(String),
}

struct Candidate<L: LeaseLock> {
    elector: Arc<LeaderElector<L>>,
    stop: CancellationToken,
    run: JoinHandle<RunOutcome>,
    events: mpsc::UnboundedReceiver<Event>,
    seen: Vec<Event>,
}

impl<L: LeaseLock> Drop for Candidate<L> {
    /// A dropped candidate stops campaigning (as if its process exited).
    fn drop(&mut self) {
        self.run.abort();
    }
}

/// Callbacks that report into a channel; the leader's work waits for its token, then
/// takes `cleanup` before it returns, reading the lease holder through `peek` at the end.
fn callbacks(
    events: mpsc::UnboundedSender<Event>,
    cleanup: Duration,
    peek: impl Fn() -> Option<String> + Send + Sync + 'static,
) -> Callbacks {
    let peek = Arc::new(peek);
    let (started, stopped, new_leader) = (events.clone(), events.clone(), events);
    Callbacks::new(move |token: CancellationToken| {
        let events = started.clone();
        let peek = Arc::clone(&peek);
        let _ = events.send(Event::Started(Instant::now()));
        async move {
            token.cancelled().await;
            let _ = events.send(Event::TokenCancelled(Instant::now()));
            sleep(cleanup).await;
            let _ = events.send(Event::WorkEnded(Instant::now(), peek()));
        }
    })
    .on_stopped_leading(move || {
        let _ = stopped.send(Event::Stopped(Instant::now()));
    })
    .on_new_leader(move |id| {
        let _ = new_leader.send(Event::NewLeader(id.to_string()));
    })
}

fn holder(lease: &MemoryLeaseLock) -> Option<String> {
    lease.current().map(|r| r.record.holder_identity)
}

fn spawn_candidate<L: LeaseLock>(
    elector: LeaderElector<L>,
    events: mpsc::UnboundedReceiver<Event>,
) -> Candidate<L> {
    let elector = Arc::new(elector);
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let elector = Arc::clone(&elector);
        let stop = stop.clone();
        async move { elector.run(&stop).await }
    });
    Candidate {
        elector,
        stop,
        run,
        events,
        seen: Vec::new(),
    }
}

/// A candidate on the shared in-memory `lease` through its own connection.
fn memory_candidate(
    lease: &MemoryLeaseLock,
    identity: &str,
    clock: Option<Arc<dyn Clock>>,
    cleanup: Duration,
) -> (Candidate<MemoryLeaseLock>, MemoryLeaseLock) {
    let connection = lease.connect();
    let (tx, rx) = mpsc::unbounded_channel();
    let peek_lease = lease.clone();
    let config = LeaderElectionConfig::new("kube-system", "test", identity);
    let mut elector = LeaderElector::new(
        config,
        connection.clone(),
        callbacks(tx, cleanup, move || holder(&peek_lease)),
    )
    .unwrap();
    if let Some(clock) = clock {
        elector = elector.with_clock(clock);
    }
    (spawn_candidate(elector, rx), connection)
}

impl<L: LeaseLock> Candidate<L> {
    /// Events so far (drains the channel).
    fn events(&mut self) -> &[Event] {
        while let Ok(e) = self.events.try_recv() {
            self.seen.push(e);
        }
        &self.seen
    }

    fn started_at(&mut self) -> Vec<Instant> {
        self.events()
            .iter()
            .filter_map(|e| match e {
                Event::Started(t) => Some(*t),
                _ => None,
            })
            .collect()
    }

    fn token_cancelled_at(&mut self) -> Option<Instant> {
        self.events().iter().find_map(|e| match e {
            Event::TokenCancelled(t) => Some(*t),
            _ => None,
        })
    }

    fn new_leaders(&mut self) -> Vec<String> {
        self.events()
            .iter()
            .filter_map(|e| match e {
                Event::NewLeader(id) => Some(id.clone()),
                _ => None,
            })
            .collect()
    }

    /// Waits (on the paused clock) until this candidate's token has been cancelled.
    async fn wait_token_cancelled(&mut self, within: Duration) -> Instant {
        let deadline = Instant::now() + within;
        loop {
            if let Some(t) = self.token_cancelled_at() {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "token not cancelled within {within:?}"
            );
            sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits (on the paused clock) until this candidate has started leading.
    async fn wait_started(&mut self, within: Duration) -> Instant {
        let deadline = Instant::now() + within;
        loop {
            if let Some(t) = self.started_at().first() {
                return *t;
            }
            assert!(
                Instant::now() < deadline,
                "did not start leading within {within:?}"
            );
            sleep(Duration::from_millis(1)).await;
        }
    }
}

fn record(holder: &str, renew_time: Timestamp) -> LeaderElectionRecord {
    LeaderElectionRecord {
        holder_identity: holder.to_string(),
        lease_duration_seconds: 15,
        acquire_time: Some(renew_time),
        renew_time: Some(renew_time),
        leader_transitions: 4,
        strategy: None,
        preferred_holder: None,
    }
}

// --- configuration -----------------------------------------------------------------------

#[test]
fn defaults_are_client_gos_and_valid() {
    let config = LeaderElectionConfig::new("kube-system", "kube-controller-manager", "node-1");
    assert_eq!(config.lease_duration, Duration::from_secs(15));
    assert_eq!(config.renew_deadline, Duration::from_secs(10));
    assert_eq!(config.retry_period, Duration::from_secs(2));
    assert_eq!(config.lease_duration_seconds(), 15);
    assert_eq!(config.validate(), Ok(()));
}

#[test]
fn validation_refuses_what_client_go_refuses() {
    let base = LeaderElectionConfig::new("kube-system", "l", "me");
    let with = |f: &dyn Fn(&mut LeaderElectionConfig)| {
        let mut c = base.clone();
        f(&mut c);
        c.validate()
    };
    // leaseDuration must be greater than renewDeadline.
    assert!(matches!(
        with(&|c| c.lease_duration = Duration::from_secs(10)),
        Err(ConfigError::LeaseDurationNotAboveRenewDeadline { .. })
    ));
    // ... as written in whole seconds: 10.9 s is written as 10.
    assert!(matches!(
        with(&|c| {
            c.lease_duration = Duration::from_millis(10_900);
            c.renew_deadline = Duration::from_millis(10_500);
        }),
        Err(ConfigError::LeaseDurationNotAboveRenewDeadline { .. })
    ));
    // renewDeadline must be greater than retryPeriod * JitterFactor (2 s * 1.2 = 2.4 s).
    assert!(matches!(
        with(&|c| c.renew_deadline = Duration::from_millis(2_400)),
        Err(ConfigError::RenewDeadlineNotAboveRetryPeriod { .. })
    ));
    assert_eq!(
        with(&|c| c.renew_deadline = Duration::from_millis(2_401)),
        Ok(())
    );
    // Everything positive.
    assert_eq!(
        with(&|c| c.lease_duration = Duration::ZERO),
        Err(ConfigError::NotPositive("leaseDuration"))
    );
    assert_eq!(
        with(&|c| c.renew_deadline = Duration::ZERO),
        Err(ConfigError::NotPositive("renewDeadline"))
    );
    assert_eq!(
        with(&|c| c.retry_period = Duration::ZERO),
        Err(ConfigError::NotPositive("retryPeriod"))
    );
    assert_eq!(
        with(&|c| c.identity.clear()),
        Err(ConfigError::EmptyIdentity)
    );
    assert_eq!(with(&|c| c.name.clear()), Err(ConfigError::EmptyName));
    assert!(matches!(
        with(&|c| c.lease_duration = Duration::from_secs(u64::from(u32::MAX))),
        Err(ConfigError::LeaseDurationTooLong(_))
    ));
    // The constructor validates too.
    let mut bad = base.clone();
    bad.retry_period = Duration::from_secs(9);
    let refused = LeaderElector::new(bad, MemoryLeaseLock::new(), Callbacks::new(|_| async {}));
    assert!(matches!(
        refused.err(),
        Some(ConfigError::RenewDeadlineNotAboveRetryPeriod { .. })
    ));
}

// --- the skew-rate arithmetic --------------------------------------------------------------

/// Reference: client-go `leaderelection.go`: "the tolerance for clock skew rate is
/// LeaseDuration/RenewDeadline". The leader stops at `renew_deadline` on its clock after
/// its last renewal; a candidate whose clock runs `r` times as fast ends its
/// `lease_duration` wait at `lease_duration / r` of the leader's time.
#[test]
fn skew_rate_tolerance_is_the_ratio_of_the_two_timeouts() {
    let config = LeaderElectionConfig::new("kube-system", "l", "me");
    let tolerance = config.clock_skew_rate_tolerance();
    assert!((tolerance - 1.5).abs() < 1e-9, "{tolerance}");

    let leader_stops_after = DEFAULT_RENEW_DEADLINE.as_secs_f64();
    let candidate_takes_over_after = |rate: f64| DEFAULT_LEASE_DURATION.as_secs_f64() / rate;
    for rate in [0.5, 1.0, 1.2, 1.49] {
        assert!(
            candidate_takes_over_after(rate) > leader_stops_after,
            "rate {rate}: overlap"
        );
    }
    for rate in [1.51, 2.0, 3.0] {
        assert!(
            candidate_takes_over_after(rate) < leader_stops_after,
            "rate {rate}: no overlap"
        );
    }
    // Exactly at the ratio the candidate's wait ends as the leader gives up.
    assert!((candidate_takes_over_after(tolerance) - leader_stops_after).abs() < 1e-9);

    // A different pair of timeouts, a different tolerance.
    let mut tight = config;
    tight.lease_duration = Duration::from_secs(11);
    tight.renew_deadline = Duration::from_secs(10);
    assert!((tight.clock_skew_rate_tolerance() - 1.1).abs() < 1e-9);
}

/// The same arithmetic, run: a partitioned leader with a true clock, and a follower whose
/// clock runs `rate` times too fast. Returns (leader's token cancelled, follower started).
async fn partitioned_leader_vs_fast_follower(rate: f64) -> (Instant, Instant) {
    let lease = MemoryLeaseLock::new();
    let (mut leader, leader_conn) = memory_candidate(&lease, "leader", None, Duration::ZERO);
    leader.wait_started(Duration::from_secs(1)).await;
    let clock: Arc<dyn Clock> = Arc::new(RateClock::new(rate, SignedDuration::ZERO));
    let (mut follower, _) = memory_candidate(&lease, "follower", Some(clock), Duration::ZERO);
    sleep(Duration::from_secs(20)).await;
    assert!(follower.started_at().is_empty());

    leader_conn.set_failing(true);
    let follower_started = follower.wait_started(Duration::from_secs(60)).await;
    let leader_cancelled = leader.wait_token_cancelled(Duration::from_secs(60)).await;
    (leader_cancelled, follower_started)
}

#[tokio::test(start_paused = true)]
async fn followers_clock_up_to_the_tolerated_rate_never_overlaps_the_leader() {
    for rate in [1.0, 1.25, 1.45] {
        for _ in 0..5 {
            let (leader_stopped, follower_started) =
                partitioned_leader_vs_fast_follower(rate).await;
            assert!(
                follower_started > leader_stopped,
                "rate {rate}: follower started {:?} before the leader stopped",
                leader_stopped - follower_started
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_follower_clock_far_past_the_tolerated_rate_overlaps_the_leader() {
    // 15 s / 3 = 5 s, plus at most two jittered retries of 4.4 s / 3: under 8 s < 10 s.
    let (leader_stopped, follower_started) = partitioned_leader_vs_fast_follower(3.0).await;
    assert!(
        follower_started < leader_stopped,
        "expected an overlap at rate 3"
    );
}

// --- elections on the in-memory lease -----------------------------------------------------

#[tokio::test(start_paused = true)]
async fn only_one_of_two_candidates_leads() {
    let lease = MemoryLeaseLock::new();
    let (mut a, _) = memory_candidate(&lease, "a", None, Duration::ZERO);
    let (mut b, _) = memory_candidate(&lease, "b", None, Duration::ZERO);
    for _ in 0..120 {
        sleep(Duration::from_millis(500)).await;
        assert!(
            !(a.elector.is_leader() && b.elector.is_leader()),
            "two leaders"
        );
    }
    let started = a.started_at().len() + b.started_at().len();
    assert_eq!(started, 1, "exactly one term started");
    let (leader, follower) = if a.elector.is_leader() {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let leader_id = leader.elector.config().identity.clone();
    let current = lease.current().expect("lease created");
    assert_eq!(current.record.holder_identity, leader_id);
    assert_eq!(
        current.record.leader_transitions, 0,
        "created, never changed hands"
    );
    assert_eq!(current.record.lease_duration_seconds, 15);
    // The leader renewed every retry period for 60 s.
    assert!(lease.writes() >= 25, "{} writes", lease.writes());
    assert_eq!(follower.elector.leader(), Some(leader_id.clone()));
    assert_eq!(follower.new_leaders(), vec![leader_id.clone()]);
    assert_eq!(leader.new_leaders(), vec![leader_id]);
}

#[tokio::test(start_paused = true)]
async fn follower_takes_over_a_lease_duration_after_the_leader_dies() {
    let lease = MemoryLeaseLock::new();
    let (mut a, _) = memory_candidate(&lease, "a", None, Duration::ZERO);
    a.wait_started(Duration::from_secs(1)).await;
    let first_acquire = lease.current().unwrap().record.acquire_time;
    let (mut b, _) = memory_candidate(&lease, "b", None, Duration::ZERO);
    sleep(Duration::from_secs(30)).await;
    assert!(b.started_at().is_empty());

    // A crash: the leader stops renewing and never releases.
    a.run.abort();
    let last_renewal = lease.last_write_at().unwrap();
    // The aborted term's work is told to stop too (a drop guard on its token).
    a.wait_token_cancelled(Duration::from_millis(10)).await;
    let started = b.wait_started(Duration::from_secs(60)).await;
    let waited = started - last_renewal;
    assert!(
        waited >= DEFAULT_LEASE_DURATION,
        "took over after {waited:?}, before the lease ran out"
    );
    // b saw the last renewal within one retry, then waited the lease, then one more retry.
    assert!(
        waited <= DEFAULT_LEASE_DURATION + 2 * max_retry_wait() + TICK,
        "took over only after {waited:?}"
    );
    let current = lease.current().unwrap().record;
    assert_eq!(current.holder_identity, "b");
    assert_eq!(current.leader_transitions, 1);
    assert_ne!(current.acquire_time, first_acquire);
    assert!(b.elector.is_leader());
}

#[tokio::test(start_paused = true)]
async fn follower_takes_over_at_once_after_a_release() {
    let lease = MemoryLeaseLock::new();
    let cleanup = Duration::from_millis(700);
    let (mut a, _) = memory_candidate(&lease, "a", None, cleanup);
    a.wait_started(Duration::from_secs(1)).await;
    let (mut b, _) = memory_candidate(&lease, "b", None, Duration::ZERO);
    sleep(Duration::from_secs(30)).await;

    let stopped_at = Instant::now();
    a.stop.cancel();
    let outcome = timeout(Duration::from_secs(5), &mut a.run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome, RunOutcome::StoppedWhileLeading { released: true });
    assert!(!a.elector.is_leader());
    // The work ended before the release, while a still held the lease...
    let events = a.events().to_vec();
    let work_ended = events.iter().find_map(|e| match e {
        Event::WorkEnded(t, holder) => Some((*t, holder.clone())),
        _ => None,
    });
    let (work_ended_at, holder_at_work_end) = work_ended.expect("work ended");
    assert_eq!(holder_at_work_end.as_deref(), Some("a"));
    assert!(work_ended_at >= stopped_at + cleanup);
    assert!(matches!(events.last(), Some(Event::Stopped(_))));
    // ... and the release wrote no holder and a one-second lease.
    let released = lease.current().unwrap().record;
    assert_eq!(released.holder_identity, "");
    assert_eq!(released.lease_duration_seconds, 1);
    assert_eq!(released.leader_transitions, 0);

    // b takes over at its next attempt, not a lease duration later.
    let started = b.wait_started(Duration::from_secs(10)).await;
    assert!(
        started - work_ended_at <= max_retry_wait() + TICK,
        "took {:?} after the release",
        started - work_ended_at
    );
    let current = lease.current().unwrap().record;
    assert_eq!(current.holder_identity, "b");
    assert_eq!(current.leader_transitions, 1);
}

#[tokio::test(start_paused = true)]
async fn stop_before_leading_returns_without_callbacks() {
    let lease = MemoryLeaseLock::new();
    lease.write(record("other", Timestamp::now()));
    let (mut b, _) = memory_candidate(&lease, "b", None, Duration::ZERO);
    sleep(Duration::from_secs(3)).await;
    b.stop.cancel();
    let outcome = (&mut b.run).await.unwrap();
    assert_eq!(outcome, RunOutcome::StoppedWithoutLeading);
    assert_eq!(b.events(), &[Event::NewLeader("other".into())]);
    assert_eq!(holder(&lease).as_deref(), Some("other"));
}

/// `docs/tricks.md` #14: the wait is timed from when *this* elector saw the record change, by
/// its own clock; another machine's `renewTime`, however far off, is never compared.
#[tokio::test(start_paused = true)]
async fn takeover_waits_a_lease_duration_by_the_local_clock_whatever_the_renew_time() {
    for offset_secs in [-3_600, 3_600, -86_400 * 365] {
        let lease = MemoryLeaseLock::new();
        let skewed = Timestamp::now()
            .checked_add(SignedDuration::from_secs(offset_secs))
            .unwrap();
        lease.write(record("other", skewed));
        let t0 = Instant::now();
        let (mut b, _) = memory_candidate(&lease, "b", None, Duration::ZERO);
        sleep(DEFAULT_LEASE_DURATION - Duration::from_secs(1)).await;
        assert!(
            b.started_at().is_empty(),
            "offset {offset_secs}s: took over before the local lease duration"
        );
        let started = b.wait_started(Duration::from_secs(60)).await;
        assert!(
            started - t0 <= DEFAULT_LEASE_DURATION + max_retry_wait() + TICK,
            "offset {offset_secs}s: waited {:?}",
            started - t0
        );
        let current = lease.current().unwrap().record;
        assert_eq!(current.holder_identity, "b");
        assert_eq!(current.leader_transitions, 5);
    }
}

#[tokio::test(start_paused = true)]
async fn a_record_that_keeps_changing_keeps_a_follower_waiting_even_with_ancient_renew_times() {
    let lease = MemoryLeaseLock::new();
    let ancient = Timestamp::now()
        .checked_sub(SignedDuration::from_hours(1))
        .unwrap();
    lease.write(record("other", ancient));
    let (mut b, _) = memory_candidate(&lease, "b", None, Duration::ZERO);
    // "other" renews every 5 s, but its clock says an hour ago (advancing a microsecond a
    // time): the record changes, so b's observedTime is refreshed by b's clock each time.
    for i in 1..=12 {
        sleep(Duration::from_secs(5)).await;
        let renew = ancient.checked_add(SignedDuration::from_micros(i)).unwrap();
        lease.write(record("other", renew));
        assert!(b.started_at().is_empty(), "took over a renewing lease");
    }
    let last_renewal = Instant::now();
    let started = b.wait_started(Duration::from_secs(60)).await;
    assert!(started - last_renewal >= DEFAULT_LEASE_DURATION);
    assert!(started - last_renewal <= DEFAULT_LEASE_DURATION + 2 * max_retry_wait() + TICK);
}

#[tokio::test(start_paused = true)]
async fn losing_the_update_race_is_not_leadership() {
    // A released lease; between b's get and b's update, "rival" writes first.
    let lease = MemoryLeaseLock::new();
    let mut released = record("", Timestamp::now());
    released.lease_duration_seconds = 1;
    lease.write(released);
    lease.interpose_before_next_write(record("rival", Timestamp::now()));
    let (mut b, _) = memory_candidate(&lease, "b", None, Duration::ZERO);
    sleep(Duration::from_millis(100)).await;
    assert!(!b.elector.is_leader());
    assert!(
        b.started_at().is_empty(),
        "a 409 Conflict was taken for leadership"
    );
    assert_eq!(holder(&lease).as_deref(), Some("rival"));
    // Next attempt b sees rival's record and waits a lease duration behind it.
    sleep(Duration::from_secs(10)).await;
    assert!(b.started_at().is_empty());
    assert_eq!(b.elector.leader().as_deref(), Some("rival"));
    assert_eq!(b.new_leaders(), vec!["rival".to_string()]);
}

#[tokio::test(start_paused = true)]
async fn losing_the_create_race_is_not_leadership() {
    let lease = MemoryLeaseLock::new();
    lease.interpose_before_next_write(record("rival", Timestamp::now()));
    let (mut b, _) = memory_candidate(&lease, "b", None, Duration::ZERO);
    sleep(Duration::from_secs(5)).await;
    assert!(
        b.started_at().is_empty(),
        "409 AlreadyExists was taken for leadership"
    );
    assert_eq!(holder(&lease).as_deref(), Some("rival"));
    assert_eq!(b.elector.leader().as_deref(), Some("rival"));
}

#[tokio::test(start_paused = true)]
async fn renewals_failing_for_the_renew_deadline_cancel_the_token() {
    let lease = MemoryLeaseLock::new();
    let (mut a, conn) = memory_candidate(&lease, "a", None, Duration::ZERO);
    a.wait_started(Duration::from_secs(1)).await;
    sleep(Duration::from_millis(7_300)).await;
    conn.set_failing(true);
    let last_renewal = lease.last_write_at().unwrap();

    let outcome = timeout(Duration::from_secs(30), &mut a.run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome, RunOutcome::LostLeadership);
    let cancelled = a.token_cancelled_at().expect("token cancelled");
    // The deadline runs from the start of the last successful renewal (which the fake
    // completes instantly), by the leader's clock.
    let after = cancelled - last_renewal;
    assert!(
        after + TICK >= DEFAULT_RENEW_DEADLINE,
        "gave up early, after {after:?}"
    );
    assert!(
        after <= DEFAULT_RENEW_DEADLINE + TICK,
        "gave up late, after {after:?}"
    );
    assert!(!a.elector.is_leader());
    assert!(a.events().iter().any(|e| matches!(e, Event::Stopped(_))));
    // Lost, not released: the record still names a until someone takes over.
    assert_eq!(holder(&lease).as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn renewal_failures_shorter_than_the_deadline_keep_leadership() {
    let lease = MemoryLeaseLock::new();
    let (mut a, conn) = memory_candidate(&lease, "a", None, Duration::ZERO);
    a.wait_started(Duration::from_secs(1)).await;
    for _ in 0..3 {
        sleep(Duration::from_secs(3)).await;
        conn.set_failing(true);
        sleep(Duration::from_secs(6)).await;
        conn.set_failing(false);
    }
    sleep(Duration::from_secs(10)).await;
    assert!(a.elector.is_leader());
    assert!(a.token_cancelled_at().is_none());
    assert_eq!(a.started_at().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_restarts_with_its_identity_keeps_the_lease() {
    let lease = MemoryLeaseLock::new();
    let (mut a, _) = memory_candidate(&lease, "a", None, Duration::ZERO);
    a.wait_started(Duration::from_secs(1)).await;
    let acquired = lease.current().unwrap().record.acquire_time;
    a.run.abort();
    sleep(Duration::from_secs(3)).await;
    // The same identity comes back: it holds the record already, so it renews at once,
    // keeping acquireTime and the transition count.
    let (mut again, _) = memory_candidate(&lease, "a", None, Duration::ZERO);
    again.wait_started(Duration::from_millis(10)).await;
    let current = lease.current().unwrap().record;
    assert_eq!(current.acquire_time, acquired);
    assert_eq!(current.leader_transitions, 0);
}

// --- over a real apiserver ----------------------------------------------------------------

fn admin_client(server: &TestServer) -> Client {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = 0.0;
    Client::new(config).unwrap()
}

/// Short timeouts so the test runs in seconds; the ratios are client-go's.
fn fast_config(identity: &str) -> LeaderElectionConfig {
    let mut config = LeaderElectionConfig::new("kube-system", "skerry-test-election", identity);
    config.lease_duration = Duration::from_secs(3);
    config.renew_deadline = Duration::from_secs(2);
    config.retry_period = Duration::from_millis(400);
    config
}

fn api_candidate(client: &Client, identity: &str) -> Candidate<LeaseApiLock> {
    let (tx, rx) = mpsc::unbounded_channel();
    let elector = LeaderElector::for_client(
        client,
        fast_config(identity),
        callbacks(tx, Duration::ZERO, || None),
    )
    .unwrap();
    spawn_candidate(elector, rx)
}

async fn wait_for_a_leader(
    candidates: &mut [&mut Candidate<LeaseApiLock>],
    within: Duration,
) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let leading: Vec<usize> = (0..candidates.len())
            .filter(|i| candidates[*i].elector.is_leader())
            .collect();
        assert!(leading.len() <= 1, "two leaders: {leading:?}");
        if let [one] = leading[..] {
            return one;
        }
        assert!(Instant::now() < deadline, "no leader within {within:?}");
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_electors_over_the_real_api() {
    let server = TestServer::start().await.unwrap();
    let client = admin_client(&server);
    let leases = client.api::<Lease>(Some("kube-system"));

    let mut a = api_candidate(&client, "a");
    let mut b = api_candidate(&client, "b");
    let first = wait_for_a_leader(&mut [&mut a, &mut b], Duration::from_secs(10)).await;
    let (leader, follower) = if first == 0 {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let leader_id = leader.elector.config().identity.clone();
    let lease = leases.get("skerry-test-election").await.unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(leader_id.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(3));
    assert_eq!(spec.lease_transitions, Some(0));

    // Renewals keep it for several lease durations; the follower never takes over.
    for _ in 0..40 {
        sleep(Duration::from_millis(200)).await;
        assert!(leader.elector.is_leader());
        assert!(!follower.elector.is_leader());
    }
    let renewed = leases.get("skerry-test-election").await.unwrap();
    assert_ne!(
        renewed.spec.as_ref().and_then(|s| s.renew_time.clone()),
        spec.renew_time,
        "renewTime advanced"
    );
    assert_eq!(follower.elector.leader(), Some(leader_id.clone()));

    // Release: the follower takes over at its next attempt, well inside a lease duration.
    let released_at = Instant::now();
    leader.stop.cancel();
    let outcome = (&mut leader.run).await.unwrap();
    assert_eq!(outcome, RunOutcome::StoppedWhileLeading { released: true });
    let took = wait_for_a_leader(&mut [&mut *follower], Duration::from_secs(3)).await;
    assert_eq!(took, 0);
    assert!(released_at.elapsed() < Duration::from_secs(3));
    let follower_id = follower.elector.config().identity.clone();
    let spec = leases
        .get("skerry-test-election")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(follower_id.as_str()));
    assert_eq!(spec.lease_transitions, Some(1));

    // A crash (no release): a new candidate waits a whole lease duration from when it first
    // saw the record unchanged.
    follower.run.abort();
    let crashed_at = Instant::now();
    let mut c = api_candidate(&client, "c");
    wait_for_a_leader(&mut [&mut c], Duration::from_secs(10)).await;
    assert!(
        crashed_at.elapsed() >= Duration::from_secs(3),
        "took over a live lease after {:?}",
        crashed_at.elapsed()
    );
    let spec = leases
        .get("skerry-test-election")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("c"));
    assert_eq!(spec.lease_transitions, Some(2));
    c.stop.cancel();
    assert_eq!(
        (&mut c.run).await.unwrap(),
        RunOutcome::StoppedWhileLeading { released: true }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_lock_turns_a_stale_resource_version_into_a_conflict() {
    let server = TestServer::start().await.unwrap();
    let client = admin_client(&server);
    let lock = LeaseApiLock::from_client(&client, "kube-system", "skerry-test-cas");
    assert_eq!(lock.describe(), "kube-system/skerry-test-cas");
    assert!(lock.get().await.unwrap().is_none());
    let now = Timestamp::from_microsecond(Timestamp::now().as_microsecond()).unwrap();
    let created = lock.create(&record("x", now)).await.unwrap();
    assert_eq!(created.record, record("x", now));
    let again: Error = lock.create(&record("y", now)).await.unwrap_err();
    assert!(again.is_already_exists(), "{again}");
    let got = lock.get().await.unwrap().unwrap();
    assert_eq!(got, created);
    let updated = lock
        .update(&created.resource_version, &record("y", now))
        .await
        .unwrap();
    assert_eq!(updated.record.holder_identity, "y");
    assert_ne!(updated.resource_version, created.resource_version);
    let stale = lock
        .update(&created.resource_version, &record("z", now))
        .await
        .unwrap_err();
    assert!(stale.is_conflict(), "{stale}");
    assert_eq!(
        lock.get().await.unwrap().unwrap().record.holder_identity,
        "y"
    );
}
