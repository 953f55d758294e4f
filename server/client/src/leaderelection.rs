//! Leader election on `coordination.k8s.io/v1` Leases: client-go's `tools/leaderelection`.
//!
//! `docs/tricks.md` #14 (leader election on observedTime and the skew-rate ratio): the
//! elector never compares a timestamp written by another machine with
//! its own clock. The `renewTime` and `acquireTime` in the Lease are written for humans and
//! `kubectl`; the decision to take over uses only *when this elector saw the record change*
//! (client-go's `observedTime`), measured on its own monotonic clock. A candidate takes
//! over only after it has watched the same record sit unchanged for a whole lease duration,
//! and then only with a conditional write (the resourceVersion it read), so a concurrent
//! renewal or a rival candidate turns its write into a 409 Conflict, never into two leaders.
//!
//! Because nothing compares absolute times across machines, any *offset* between clocks is
//! tolerated. What is not tolerated is a difference in clock *rate*, and the tolerance is
//! the ratio of two timeouts, [`LeaderElectionConfig::clock_skew_rate_tolerance`]:
//!
//! - the leader gives up (cancels its [`CancellationToken`]) once `renew_deadline` has
//!   passed on *its* clock since the start of its last successful renewal;
//! - a candidate first sees that renewal no earlier than it was written, and waits
//!   `lease_duration` on *its* clock before it may write;
//! - so if the candidate's clock runs `r` times as fast as the leader's, the candidate's wait
//!   lasts `lease_duration / r` in leader time, and the two never lead at once while
//!   `lease_duration / r > renew_deadline`, i.e. `r < lease_duration / renew_deadline`
//!   (15 s / 10 s = 1.5 with client-go's defaults).
//!
//! One deliberate difference from client-go: there the renew deadline is a timeout on each
//! round of renewal retries, and a round starts a retry period after the last success, so a
//! leader may act up to `renew_deadline + retry_period` (12 s) after its last renewal and
//! the real tolerance is 15/12. Here the deadline runs from the start of the last successful
//! renewal, which makes the documented ratio exact.
//!
//! This is not fencing: a leader that stalls (a GC pause, a stopped VM) longer than the
//! difference can still act after another has taken over, exactly as in client-go. Work that
//! must be exclusive has to use the apiserver's optimistic concurrency as well.
//!
//! The pieces: [`LeaderElectionConfig`] (timeouts with client-go's defaults and validation),
//! [`LeaseLock`] (where the record lives: [`LeaseApiLock`] over the apiserver,
//! [`MemoryLeaseLock`] in memory for tests), [`Clock`] ([`TokioClock`]; [`RateClock`] to
//! simulate skew), [`Callbacks`] and [`LeaderElector::run`], one election term.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Status};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::api::{Api, Client, PostParams};

/// client-go's default `LeaseDuration` (kube-controller-manager and kube-scheduler
/// `--leader-elect-lease-duration`): how long a candidate waits after it last saw the record
/// change before it may take over. Longer means a slower failover after a crash; shorter
/// means less tolerance for clock-rate skew and for a leader's slow renewals.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);

/// client-go's default `RenewDeadline` (`--leader-elect-renew-deadline`): how long the leader
/// keeps retrying a failing renewal before it gives up leadership. Must stay below the lease
/// duration; the ratio of the two is the tolerated clock-rate skew (1.5 here).
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// client-go's default `RetryPeriod` (`--leader-elect-retry-period`): the pause between
/// attempts to acquire or renew. Shorter means faster failover and more writes (a renewal is
/// one Raft round every period); longer leaves fewer retries inside the renew deadline.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// client-go's `JitterFactor`: acquisition attempts wait `retry_period * (1 + rand * 1.2)`,
/// so candidates that started together spread out. The renew deadline must exceed
/// `JITTER_FACTOR * retry_period` so the leader gets more than one try before giving up.
pub const JITTER_FACTOR: f64 = 1.2;

/// `leaseDurationSeconds` written on release (client-go's `release()`): the record then
/// expires one second after a candidate sees it, and with no holder a candidate need not
/// wait at all.
const RELEASED_LEASE_DURATION_SECONDS: i32 = 1;

/// The longest lease duration accepted: `leaseDurationSeconds` is an int32.
const LEASE_DURATION_MAX: Duration = Duration::from_secs(i32::MAX as u64);

/// What a Lease says about its holder: client-go's `LeaderElectionRecord`, the fields of
/// `LeaseSpec` the elector owns. Times are wall-clock and informational only (see the
/// module docs); they are kept at the microsecond precision of `MicroTime` so a record read
/// back compares equal to the one written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderElectionRecord {
    /// `holderIdentity`; empty when nobody holds the lease (released).
    pub holder_identity: String,
    /// `leaseDurationSeconds`: how long candidates wait after they saw this record.
    pub lease_duration_seconds: i32,
    /// `acquireTime`: when the holder acquired the lease, by the holder's wall clock.
    pub acquire_time: Option<Timestamp>,
    /// `renewTime`: when the holder last renewed, by the holder's wall clock.
    pub renew_time: Option<Timestamp>,
    /// `leaseTransitions`: how many times the holder has changed.
    pub leader_transitions: i32,
    /// `strategy` (coordinated leader election); kept as found.
    pub strategy: Option<String>,
    /// `preferredHolder` (coordinated leader election); kept as found.
    pub preferred_holder: Option<String>,
}

impl LeaderElectionRecord {
    /// The record in a Lease's spec (client-go's `LeaseSpecToLeaderElectionRecord`).
    pub fn from_spec(spec: &LeaseSpec) -> LeaderElectionRecord {
        LeaderElectionRecord {
            holder_identity: spec.holder_identity.clone().unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or_default(),
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            leader_transitions: spec.lease_transitions.unwrap_or_default(),
            strategy: spec.strategy.clone(),
            preferred_holder: spec.preferred_holder.clone(),
        }
    }

    /// The record as a Lease spec (client-go's `LeaderElectionRecordToLeaseSpec`).
    pub fn to_spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder_identity.clone()),
            lease_duration_seconds: Some(self.lease_duration_seconds),
            acquire_time: self.acquire_time.map(MicroTime),
            renew_time: self.renew_time.map(MicroTime),
            lease_transitions: Some(self.leader_transitions),
            strategy: self.strategy.clone(),
            preferred_holder: self.preferred_holder.clone(),
        }
    }
}

/// A record as stored, with the resourceVersion an update must present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `metadata.resourceVersion` of the stored Lease.
    pub resource_version: String,
    /// The record.
    pub record: LeaderElectionRecord,
}

/// Where the election record lives (client-go's `resourcelock.Interface`).
///
/// `update` is a compare-and-swap on the resourceVersion: it must fail with a 409 Conflict
/// ([`Error::is_conflict`]) when the stored record has changed since `resource_version`.
/// That condition is the whole of the mutual exclusion.
pub trait LeaseLock: Send + Sync + 'static {
    /// The current record, `None` when the lease does not exist.
    fn get(&self) -> impl Future<Output = Result<Option<LeaseRecord>, Error>> + Send;
    /// Creates the lease; 409 AlreadyExists when it exists.
    fn create(
        &self,
        record: &LeaderElectionRecord,
    ) -> impl Future<Output = Result<LeaseRecord, Error>> + Send;
    /// Replaces the record if the stored one is still at `resource_version`.
    fn update(
        &self,
        resource_version: &str,
        record: &LeaderElectionRecord,
    ) -> impl Future<Output = Result<LeaseRecord, Error>> + Send;
    /// `namespace/name`, for logs.
    fn describe(&self) -> String;
}

/// The election record in a `coordination.k8s.io/v1` Lease on the apiserver.
pub struct LeaseApiLock {
    api: Api<Lease>,
    name: String,
    /// The last Lease read or written, so an update keeps what the elector does not own
    /// (labels, annotations, owner references), as client-go's `LeaseLock` keeps `ll.lease`.
    /// A mutex held only to clone or store, never across a request.
    last: Mutex<Option<Lease>>,
}

impl LeaseApiLock {
    /// The lease `name` in the namespace of `api`.
    pub fn new(api: Api<Lease>, name: &str) -> LeaseApiLock {
        LeaseApiLock {
            api,
            name: name.to_string(),
            last: Mutex::new(None),
        }
    }

    /// The lease `namespace/name` through `client`.
    pub fn from_client(client: &Client, namespace: &str, name: &str) -> LeaseApiLock {
        LeaseApiLock::new(client.api::<Lease>(Some(namespace)), name)
    }

    fn remember(&self, lease: &Lease) -> LeaseRecord {
        *self.last.lock() = Some(lease.clone());
        LeaseRecord {
            resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
            record: LeaderElectionRecord::from_spec(&lease.spec.clone().unwrap_or_default()),
        }
    }

    fn fresh_lease(&self, record: &LeaderElectionRecord) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: self.api.namespace().map(str::to_string),
                ..ObjectMeta::default()
            },
            spec: Some(record.to_spec()),
        }
    }
}

impl LeaseLock for LeaseApiLock {
    async fn get(&self) -> Result<Option<LeaseRecord>, Error> {
        Ok(self
            .api
            .get_opt(&self.name)
            .await?
            .map(|lease| self.remember(&lease)))
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<LeaseRecord, Error> {
        let lease = self.fresh_lease(record);
        let created = self.api.create(&PostParams::default(), &lease).await?;
        Ok(self.remember(&created))
    }

    async fn update(
        &self,
        resource_version: &str,
        record: &LeaderElectionRecord,
    ) -> Result<LeaseRecord, Error> {
        // An empty resourceVersion would make the PUT unconditional: no compare-and-swap,
        // no mutual exclusion. Refuse it rather than risk two leaders.
        if resource_version.is_empty() {
            return Err(Error::Decode(format!(
                "lease {} has no resourceVersion to update against",
                self.describe()
            )));
        }
        let last = self.last.lock().clone();
        let mut lease = last
            .filter(|l| l.metadata.name.as_deref() == Some(self.name.as_str()))
            .unwrap_or_else(|| self.fresh_lease(record));
        lease.metadata.resource_version = Some(resource_version.to_string());
        lease.spec = Some(record.to_spec());
        let replaced = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(self.remember(&replaced))
    }

    fn describe(&self) -> String {
        match self.api.namespace() {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// An in-memory lease for tests: clones and [`MemoryLeaseLock::connect`]ed handles share one
/// record; each connected handle has its own fault switch, so one elector can be cut off
/// while another still reaches the lease.
#[derive(Clone, Default)]
pub struct MemoryLeaseLock {
    /// The shared lease. A mutex because every operation is a short read-modify-write with no
    /// await inside.
    shared: Arc<Mutex<MemoryLease>>,
    /// This handle's fault switch: while set, every operation fails as a transport error.
    failing: Arc<AtomicBool>,
}

#[derive(Default)]
struct MemoryLease {
    current: Option<LeaseRecord>,
    last_resource_version: u64,
    /// A write by "another machine" applied just before the next create or update is
    /// checked, to stage a lost race deterministically.
    interpose: Option<LeaderElectionRecord>,
    /// Successful writes (creates and updates), for tests.
    writes: u64,
    /// When the last write landed, on tokio's clock.
    last_write_at: Option<Instant>,
}

impl MemoryLease {
    fn store(&mut self, record: LeaderElectionRecord) -> LeaseRecord {
        self.last_resource_version += 1;
        self.writes += 1;
        self.last_write_at = Some(Instant::now());
        let stored = LeaseRecord {
            resource_version: self.last_resource_version.to_string(),
            record,
        };
        self.current = Some(stored.clone());
        stored
    }
}

impl MemoryLeaseLock {
    /// An empty lease (not yet created).
    pub fn new() -> MemoryLeaseLock {
        MemoryLeaseLock::default()
    }

    /// Another handle on the same lease with its own fault switch.
    pub fn connect(&self) -> MemoryLeaseLock {
        MemoryLeaseLock {
            shared: Arc::clone(&self.shared),
            failing: Arc::new(AtomicBool::new(false)),
        }
    }

    /// While `failing`, every operation through this handle fails with a transport error.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// The stored record.
    pub fn current(&self) -> Option<LeaseRecord> {
        self.shared.lock().current.clone()
    }

    /// Writes `record` unconditionally, as another machine would.
    pub fn write(&self, record: LeaderElectionRecord) -> LeaseRecord {
        self.shared.lock().store(record)
    }

    /// Makes the next create or update lose a race: `record` is written first (as another
    /// machine), so the create fails with 409 AlreadyExists and the update, whose
    /// resourceVersion is now stale, with 409 Conflict.
    pub fn interpose_before_next_write(&self, record: LeaderElectionRecord) {
        self.shared.lock().interpose = Some(record);
    }

    /// Successful creates and updates so far.
    pub fn writes(&self) -> u64 {
        self.shared.lock().writes
    }

    /// When the last successful write landed, on tokio's clock.
    pub fn last_write_at(&self) -> Option<Instant> {
        self.shared.lock().last_write_at
    }

    fn check_reachable(&self) -> Result<(), Error> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::Transport("injected failure".to_string()));
        }
        Ok(())
    }
}

fn status_error(code: i32, reason: &str, message: String) -> Error {
    Error::Api(Box::new(Status {
        code: Some(code),
        reason: Some(reason.to_string()),
        message: Some(message),
        status: Some("Failure".to_string()),
        ..Status::default()
    }))
}

impl LeaseLock for MemoryLeaseLock {
    async fn get(&self) -> Result<Option<LeaseRecord>, Error> {
        self.check_reachable()?;
        Ok(self.current())
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<LeaseRecord, Error> {
        self.check_reachable()?;
        let mut shared = self.shared.lock();
        if let Some(rival) = shared.interpose.take() {
            shared.store(rival);
        }
        if shared.current.is_some() {
            return Err(status_error(
                409,
                "AlreadyExists",
                "leases.coordination.k8s.io already exists".to_string(),
            ));
        }
        Ok(shared.store(record.clone()))
    }

    async fn update(
        &self,
        resource_version: &str,
        record: &LeaderElectionRecord,
    ) -> Result<LeaseRecord, Error> {
        self.check_reachable()?;
        let mut shared = self.shared.lock();
        if let Some(rival) = shared.interpose.take() {
            shared.store(rival);
        }
        let Some(current) = shared.current.as_ref() else {
            return Err(status_error(
                404,
                "NotFound",
                "leases.coordination.k8s.io not found".to_string(),
            ));
        };
        if current.resource_version != resource_version {
            return Err(status_error(
                409,
                "Conflict",
                format!(
                    "the object has been modified: resourceVersion {resource_version} is not {}",
                    current.resource_version
                ),
            ));
        }
        Ok(shared.store(record.clone()))
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }
}

/// The elector's clocks: a monotonic one for every decision, and a wall clock only for the
/// informational times written into the record.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic now.
    fn now(&self) -> Instant;
    /// Waits `duration` as measured by this clock.
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
    /// Wall-clock now, written as `acquireTime`/`renewTime`.
    fn wall(&self) -> Timestamp;
}

/// tokio's clock (pausable in tests) and the system wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
    fn wall(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock running `rate` times as fast as tokio's, with a wall clock set `wall_offset`
/// away from the system's: a machine with a skewed clock, for tests.
#[derive(Clone, Debug)]
pub struct RateClock {
    rate: f64,
    origin: Instant,
    wall_origin: Timestamp,
}

impl RateClock {
    /// # Panics
    /// If `rate` is not a positive finite number (a programmer error in a test).
    pub fn new(rate: f64, wall_offset: SignedDuration) -> RateClock {
        assert!(
            rate.is_finite() && rate > 0.0,
            "clock rate {rate} must be positive"
        );
        let now = Timestamp::now();
        RateClock {
            rate,
            origin: Instant::now(),
            wall_origin: now.checked_add(wall_offset).unwrap_or(now),
        }
    }
}

impl Clock for RateClock {
    fn now(&self) -> Instant {
        self.origin + (Instant::now() - self.origin).mul_f64(self.rate)
    }
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration.div_f64(self.rate)))
    }
    fn wall(&self) -> Timestamp {
        let elapsed = (Instant::now() - self.origin).mul_f64(self.rate);
        SignedDuration::try_from(elapsed)
            .ok()
            .and_then(|d| self.wall_origin.checked_add(d).ok())
            .unwrap_or(self.wall_origin)
    }
}

/// Why a [`LeaderElectionConfig`] was refused (client-go's `NewLeaderElector` checks).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A timeout of zero.
    #[error("{0} must be greater than zero")]
    NotPositive(&'static str),
    /// `lease_duration` (in whole seconds, as written) must exceed `renew_deadline`.
    #[error(
        "leaseDuration {lease_duration:?} must be greater than renewDeadline {renew_deadline:?}"
    )]
    LeaseDurationNotAboveRenewDeadline {
        /// The lease duration, truncated to whole seconds as `leaseDurationSeconds` holds it.
        lease_duration: Duration,
        /// The renew deadline.
        renew_deadline: Duration,
    },
    /// `renew_deadline` must exceed `JITTER_FACTOR * retry_period`.
    #[error(
        "renewDeadline {renew_deadline:?} must be greater than retryPeriod*JitterFactor {retry_period:?}*{JITTER_FACTOR}"
    )]
    RenewDeadlineNotAboveRetryPeriod {
        /// The renew deadline.
        renew_deadline: Duration,
        /// The retry period.
        retry_period: Duration,
    },
    /// `lease_duration` does not fit `leaseDurationSeconds` (int32).
    #[error("leaseDuration {0:?} is too long")]
    LeaseDurationTooLong(Duration),
    /// The identity is empty (an empty holder means "released").
    #[error("identity must not be empty")]
    EmptyIdentity,
    /// The lease name is empty.
    #[error("lease name must not be empty")]
    EmptyName,
}

/// One election: which lease, who is asking, and the three timeouts.
#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    /// The Lease's namespace (`kube-system` for the control plane's components).
    pub namespace: String,
    /// The Lease's name (e.g. `kube-controller-manager`).
    pub name: String,
    /// This candidate's identity, unique among candidates (client-go uses hostname + UUID).
    pub identity: String,
    /// How long a candidate waits after it last saw the record change before it takes
    /// over. Written into the record as whole seconds.
    pub lease_duration: Duration,
    /// How long the leader retries a failing renewal before it gives up.
    pub renew_deadline: Duration,
    /// The pause between attempts.
    pub retry_period: Duration,
    /// On stop, a leader waits for its work to end and then writes the lease with no holder
    /// and `leaseDurationSeconds: 1`, so another candidate takes over at once.
    pub release_on_cancel: bool,
}

impl LeaderElectionConfig {
    /// client-go's defaults (15 s / 10 s / 2 s), releasing on stop.
    pub fn new(namespace: &str, name: &str, identity: &str) -> LeaderElectionConfig {
        LeaderElectionConfig {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            release_on_cancel: true,
        }
    }

    /// client-go's checks: every timeout positive, `lease_duration > renew_deadline`,
    /// `renew_deadline > JITTER_FACTOR * retry_period`; and a non-empty identity and name.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_duration.is_zero() {
            return Err(ConfigError::NotPositive("leaseDuration"));
        }
        if self.renew_deadline.is_zero() {
            return Err(ConfigError::NotPositive("renewDeadline"));
        }
        if self.retry_period.is_zero() {
            return Err(ConfigError::NotPositive("retryPeriod"));
        }
        if self.lease_duration > LEASE_DURATION_MAX {
            return Err(ConfigError::LeaseDurationTooLong(self.lease_duration));
        }
        // Candidates wait what the record says, whole seconds: compare what is written.
        let written = Duration::from_secs(self.lease_duration.as_secs());
        if written <= self.renew_deadline {
            return Err(ConfigError::LeaseDurationNotAboveRenewDeadline {
                lease_duration: written,
                renew_deadline: self.renew_deadline,
            });
        }
        if self.renew_deadline <= self.retry_period.mul_f64(JITTER_FACTOR) {
            return Err(ConfigError::RenewDeadlineNotAboveRetryPeriod {
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            });
        }
        if self.identity.is_empty() {
            return Err(ConfigError::EmptyIdentity);
        }
        if self.name.is_empty() {
            return Err(ConfigError::EmptyName);
        }
        Ok(())
    }

    /// `leaseDurationSeconds` as written into the record.
    pub fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// The clock-rate skew the election tolerates: `lease_duration / renew_deadline`.
    ///
    /// The leader stops leading `renew_deadline` after the start of its last successful
    /// renewal, by its own clock. A candidate cannot have seen that renewal before it was
    /// written, and then waits `lease_duration` by its own clock. If the candidate's clock
    /// runs `r` times as fast as the leader's, that wait is `lease_duration / r` of the
    /// leader's time, so two leaders never overlap while
    /// `lease_duration / r > renew_deadline`, i.e. while `r` is below this ratio. With
    /// client-go's defaults: 15 s / 10 s = 1.5, a candidate's clock may run up to 50 %
    /// fast. Offsets between clocks do not matter at all: no absolute time is compared
    /// across machines.
    pub fn clock_skew_rate_tolerance(&self) -> f64 {
        let written = Duration::from_secs(self.lease_duration.as_secs());
        written.as_secs_f64() / self.renew_deadline.as_secs_f64()
    }
}

type StartedLeading = Box<dyn Fn(CancellationToken) -> BoxFuture<'static, ()> + Send + Sync>;
type StoppedLeading = Box<dyn Fn() + Send + Sync>;
type NewLeader = Box<dyn Fn(&str) + Send + Sync>;

/// What the elector calls as leadership changes.
///
/// `on_started_leading` returns the leader's work as a future, which the elector spawns; it
/// must return soon after its token is cancelled. `on_stopped_leading` and `on_new_leader`
/// run on the elector's task and must not block.
pub struct Callbacks {
    on_started_leading: StartedLeading,
    on_stopped_leading: StoppedLeading,
    on_new_leader: NewLeader,
}

impl Callbacks {
    /// `on_started_leading(token)`: the work to do while leading; `token` is cancelled when
    /// leadership is lost or the elector is stopped.
    pub fn new<F, Fut>(on_started_leading: F) -> Callbacks
    where
        F: Fn(CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Callbacks {
            on_started_leading: Box::new(move |token| Box::pin(on_started_leading(token))),
            on_stopped_leading: Box::new(|| {}),
            on_new_leader: Box::new(|_| {}),
        }
    }

    /// Called after a term as leader ends (lost or stopped), once the token is cancelled.
    pub fn on_stopped_leading(mut self, f: impl Fn() + Send + Sync + 'static) -> Callbacks {
        self.on_stopped_leading = Box::new(f);
        self
    }

    /// Called with the holder's identity whenever the observed holder changes (including to
    /// this candidate); not called when the lease is released (no holder).
    pub fn on_new_leader(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Callbacks {
        self.on_new_leader = Box::new(f);
        self
    }
}

/// How a [`LeaderElector::run`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// Stopped before it ever led.
    StoppedWithoutLeading,
    /// Stopped while leading; `released` when the lease was handed back.
    StoppedWhileLeading {
        /// The lease was written with no holder.
        released: bool,
    },
    /// Renewals failed for `renew_deadline`: leadership lost.
    LostLeadership,
}

/// What this elector last saw in the lease, and when (on its own clock).
#[derive(Default)]
struct Observed {
    record: Option<LeaseRecord>,
    /// When *this* elector saw the record change: the only time it compares with `now`.
    time: Option<Instant>,
    /// The holder last reported to `on_new_leader`.
    reported_leader: String,
}

/// A candidate in one election (client-go's `LeaderElector`).
pub struct LeaderElector<L> {
    config: LeaderElectionConfig,
    lock: L,
    clock: Arc<dyn Clock>,
    callbacks: Callbacks,
    /// What was last observed. A mutex held for a few field reads or writes, never across an
    /// await; `run` writes it, `leader()` reads it from any task.
    observed: Mutex<Observed>,
    /// Set while in a term as leader (between acquiring and cancelling the token).
    leading: AtomicBool,
    /// Set while `run` executes: one term at a time.
    running: AtomicBool,
}

impl LeaderElector<LeaseApiLock> {
    /// An elector on the Lease `config.namespace/config.name` through `client`.
    pub fn for_client(
        client: &Client,
        config: LeaderElectionConfig,
        callbacks: Callbacks,
    ) -> Result<LeaderElector<LeaseApiLock>, ConfigError> {
        let lock = LeaseApiLock::from_client(client, &config.namespace, &config.name);
        LeaderElector::new(config, lock, callbacks)
    }
}

/// Clears a flag when dropped, so a cancelled or panicking `run` does not leave it set.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// `retry_period` stretched by up to `JITTER_FACTOR` (client-go's `wait.Jitter`).
fn jittered(retry_period: Duration) -> Duration {
    retry_period + retry_period.mul_f64(rand::random::<f64>() * JITTER_FACTOR)
}

/// Microsecond precision, as `MicroTime` stores it.
fn to_micros(t: Timestamp) -> Timestamp {
    Timestamp::from_microsecond(t.as_microsecond()).unwrap_or(t)
}

impl<L: LeaseLock> LeaderElector<L> {
    /// An elector on `lock`, after [`LeaderElectionConfig::validate`].
    pub fn new(
        config: LeaderElectionConfig,
        lock: L,
        callbacks: Callbacks,
    ) -> Result<LeaderElector<L>, ConfigError> {
        config.validate()?;
        Ok(LeaderElector {
            config,
            lock,
            clock: Arc::new(TokioClock),
            callbacks,
            observed: Mutex::new(Observed::default()),
            leading: AtomicBool::new(false),
            running: AtomicBool::new(false),
        })
    }

    /// Uses `clock` instead of tokio's (tests simulate skewed machines with [`RateClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> LeaderElector<L> {
        self.clock = clock;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &LeaderElectionConfig {
        &self.config
    }

    /// True while this elector is in a term as leader.
    pub fn is_leader(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// The holder last observed in the lease, if any.
    pub fn leader(&self) -> Option<String> {
        self.observed
            .lock()
            .record
            .as_ref()
            .map(|r| r.record.holder_identity.clone())
            .filter(|h| !h.is_empty())
    }

    /// One term: campaigns until it acquires the lease or `stop` is cancelled, then leads,
    /// renewing every `retry_period`, until renewals fail for `renew_deadline` (the token
    /// given to `on_started_leading` is cancelled, [`RunOutcome::LostLeadership`]) or `stop`
    /// is cancelled (the token is cancelled with it; with `release_on_cancel` the lease is
    /// released once the work has returned). Call again to campaign for another term.
    ///
    /// # Panics
    /// If `run` is already running on this elector (one term at a time).
    pub async fn run(&self, stop: &CancellationToken) -> RunOutcome {
        let was_running = self.running.swap(true, Ordering::SeqCst);
        assert!(
            !was_running,
            "LeaderElector::run called while already running"
        );
        let _running = ClearOnDrop(&self.running);

        let desc = self.lock.describe();
        tracing::info!(lease = %desc, identity = %self.config.identity, "attempting to acquire leader lease");
        let Some(acquired_at) = self.acquire(stop).await else {
            return RunOutcome::StoppedWithoutLeading;
        };
        tracing::info!(lease = %desc, identity = %self.config.identity, "became leader");

        let token = stop.child_token();
        // If this future is dropped mid-term (its task aborted), the work must stop too.
        let _cancel_on_drop = token.clone().drop_guard();
        self.leading.store(true, Ordering::SeqCst);
        let _leading = ClearOnDrop(&self.leading);
        let work = tokio::spawn((self.callbacks.on_started_leading)(token.clone()));

        let outcome = match self.renew(stop, acquired_at).await {
            Renewal::Lost => {
                tracing::info!(lease = %desc, identity = %self.config.identity, "lost leadership: renewals failed for the renew deadline");
                token.cancel();
                RunOutcome::LostLeadership
            }
            Renewal::Stopped { deadline } => {
                token.cancel();
                let released = self.config.release_on_cancel
                    && self.wait_for_work(work, deadline).await
                    && self.release().await;
                RunOutcome::StoppedWhileLeading { released }
            }
        };
        self.leading.store(false, Ordering::SeqCst);
        (self.callbacks.on_stopped_leading)();
        outcome
    }

    /// Campaigns until acquired (returns when the winning attempt started) or stopped.
    async fn acquire(&self, stop: &CancellationToken) -> Option<Instant> {
        loop {
            let started = self.clock.now();
            let acquired = tokio::select! {
                _ = stop.cancelled() => return None,
                acquired = self.try_acquire_or_renew_bounded(self.config.renew_deadline) => acquired,
            };
            self.maybe_report_transition();
            if acquired {
                return Some(started);
            }
            // client-go's wait.JitterUntil(..., RetryPeriod, JitterFactor, sliding=true).
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = self.clock.sleep(jittered(self.config.retry_period)) => {}
            }
        }
    }

    /// Renews every `retry_period` until a renewal cannot succeed before `renew_deadline`
    /// has passed since the start of the last successful one, or `stop`.
    async fn renew(&self, stop: &CancellationToken, acquired_at: Instant) -> Renewal {
        let mut last_renewed_at = acquired_at;
        loop {
            let deadline = last_renewed_at + self.config.renew_deadline;
            tokio::select! {
                _ = stop.cancelled() => return Renewal::Stopped { deadline },
                _ = self.clock.sleep(self.config.retry_period) => {}
            }
            loop {
                let started = self.clock.now();
                if started >= deadline {
                    return Renewal::Lost;
                }
                let renewed = tokio::select! {
                    _ = stop.cancelled() => return Renewal::Stopped { deadline },
                    renewed = self.try_acquire_or_renew_bounded(deadline - started) => renewed,
                };
                self.maybe_report_transition();
                if renewed {
                    tracing::trace!(lease = %self.lock.describe(), "renewed lease");
                    last_renewed_at = started;
                    break;
                }
                let remaining = deadline.saturating_duration_since(self.clock.now());
                tokio::select! {
                    _ = stop.cancelled() => return Renewal::Stopped { deadline },
                    _ = self.clock.sleep(self.config.retry_period.min(remaining)) => {}
                }
            }
        }
    }

    /// Waits for the leader's work to return, until `deadline`; true when it did.
    async fn wait_for_work(&self, work: tokio::task::JoinHandle<()>, deadline: Instant) -> bool {
        let remaining = deadline.saturating_duration_since(self.clock.now());
        tokio::select! {
            joined = work => {
                if let Err(e) = joined {
                    tracing::warn!(error = %e, "leader work ended abnormally");
                }
                true
            }
            _ = self.clock.sleep(remaining) => {
                tracing::warn!(lease = %self.lock.describe(), "leader work still running at the renew deadline; not releasing the lease");
                false
            }
        }
    }

    /// One attempt, abandoned after `bound` (a hung request must not outlive the deadline).
    async fn try_acquire_or_renew_bounded(&self, bound: Duration) -> bool {
        tokio::select! {
            acquired = self.try_acquire_or_renew() => acquired,
            _ = self.clock.sleep(bound) => {
                tracing::debug!(lease = %self.lock.describe(), "acquire or renew timed out");
                false
            }
        }
    }

    /// client-go's `tryAcquireOrRenew`: true when this candidate holds the lease after it.
    async fn try_acquire_or_renew(&self) -> bool {
        let now_wall = to_micros(self.clock.wall());
        let mut desired = LeaderElectionRecord {
            holder_identity: self.config.identity.clone(),
            lease_duration_seconds: self.config.lease_duration_seconds(),
            acquire_time: Some(now_wall),
            renew_time: Some(now_wall),
            leader_transitions: 0,
            strategy: None,
            preferred_holder: None,
        };

        // 1. Fast path: the leader updates on the version it last wrote.
        if let Some(observed) = self.observed_if_leading_and_valid() {
            desired.acquire_time = observed.record.acquire_time;
            desired.leader_transitions = observed.record.leader_transitions;
            desired.strategy = observed.record.strategy.clone();
            desired.preferred_holder = observed.record.preferred_holder.clone();
            match self.lock.update(&observed.resource_version, &desired).await {
                Ok(written) => {
                    self.set_observed(written);
                    return true;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "optimistic renewal failed, falling back to get");
                }
            }
        }

        // 2. Get, or create.
        let current = match self.lock.get().await {
            Ok(Some(current)) => current,
            Ok(None) => {
                return match self.lock.create(&desired).await {
                    Ok(created) => {
                        self.set_observed(created);
                        true
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "creating the lease failed");
                        false
                    }
                };
            }
            Err(e) => {
                tracing::debug!(lease = %self.lock.describe(), error = %e, "getting the lease failed");
                return false;
            }
        };

        // 3. A changed record restarts the wait, timed by this elector's clock alone.
        let now = self.clock.now();
        let held_by_other_and_valid = {
            let mut observed = self.observed.lock();
            let changed = observed.record.as_ref().map(|o| &o.record) != Some(&current.record);
            if changed {
                observed.time = Some(now);
            }
            observed.record = Some(current.clone());
            let holder = &current.record.holder_identity;
            !holder.is_empty() && *holder != self.config.identity && lease_valid(&observed, now)
        };
        if held_by_other_and_valid {
            return false;
        }

        // 4. Take over or renew, conditional on the version just read.
        desired.strategy = current.record.strategy.clone();
        desired.preferred_holder = current.record.preferred_holder.clone();
        if current.record.holder_identity == self.config.identity {
            desired.acquire_time = current.record.acquire_time;
            desired.leader_transitions = current.record.leader_transitions;
        } else {
            desired.leader_transitions = current.record.leader_transitions.saturating_add(1);
        }
        match self.lock.update(&current.resource_version, &desired).await {
            Ok(written) => {
                self.set_observed(written);
                true
            }
            Err(e) => {
                tracing::debug!(lease = %self.lock.describe(), error = %e, "updating the lease failed");
                false
            }
        }
    }

    /// client-go's `release`: re-reads the lease and, if this candidate still holds it,
    /// writes it with no holder and a one-second duration. True when released (or when
    /// another already holds it).
    async fn release(&self) -> bool {
        let attempt = async {
            let current = match self.lock.get().await {
                Ok(Some(current)) => current,
                Ok(None) => return true,
                Err(e) => {
                    tracing::warn!(lease = %self.lock.describe(), error = %e, "failed to release the lease");
                    return false;
                }
            };
            if current.record.holder_identity != self.config.identity {
                return true;
            }
            let now_wall = to_micros(self.clock.wall());
            let released = LeaderElectionRecord {
                holder_identity: String::new(),
                lease_duration_seconds: RELEASED_LEASE_DURATION_SECONDS,
                acquire_time: Some(now_wall),
                renew_time: Some(now_wall),
                leader_transitions: current.record.leader_transitions,
                strategy: current.record.strategy.clone(),
                preferred_holder: current.record.preferred_holder.clone(),
            };
            match self.lock.update(&current.resource_version, &released).await {
                Ok(written) => {
                    tracing::info!(lease = %self.lock.describe(), "released the lease");
                    self.set_observed(written);
                    true
                }
                Err(e) => {
                    tracing::warn!(lease = %self.lock.describe(), error = %e, "failed to release the lease");
                    false
                }
            }
        };
        tokio::select! {
            released = attempt => released,
            _ = self.clock.sleep(self.config.renew_deadline) => false,
        }
    }

    /// The observed record when this candidate holds it and its lease has not run out.
    fn observed_if_leading_and_valid(&self) -> Option<LeaseRecord> {
        let observed = self.observed.lock();
        let record = observed.record.as_ref()?;
        let mine = record.record.holder_identity == self.config.identity;
        (mine && lease_valid(&observed, self.clock.now())).then(|| record.clone())
    }

    /// After this candidate's own write: the record is what it wrote, observed now.
    fn set_observed(&self, written: LeaseRecord) {
        let now = self.clock.now();
        let mut observed = self.observed.lock();
        observed.record = Some(written);
        observed.time = Some(now);
    }

    /// Calls `on_new_leader` when the observed holder changed since the last report.
    fn maybe_report_transition(&self) {
        let holder = {
            let mut observed = self.observed.lock();
            let holder = observed
                .record
                .as_ref()
                .map(|r| r.record.holder_identity.clone())
                .unwrap_or_default();
            if holder == observed.reported_leader {
                return;
            }
            observed.reported_leader = holder.clone();
            holder
        };
        if !holder.is_empty() {
            tracing::info!(lease = %self.lock.describe(), leader = %holder, "new leader observed");
            (self.callbacks.on_new_leader)(&holder);
        }
    }
}

/// How the leading phase ended.
enum Renewal {
    Lost,
    Stopped { deadline: Instant },
}

/// client-go's `isLeaseValid`: the observed record's duration has not run out since this
/// elector observed it.
fn lease_valid(observed: &Observed, now: Instant) -> bool {
    let (Some(record), Some(time)) = (observed.record.as_ref(), observed.time) else {
        return false;
    };
    let seconds = u64::try_from(record.record.lease_duration_seconds).unwrap_or(0);
    time + Duration::from_secs(seconds) > now
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_client_go_bounds() {
        for _ in 0..1_000 {
            let d = jittered(DEFAULT_RETRY_PERIOD);
            assert!(d >= DEFAULT_RETRY_PERIOD, "{d:?}");
            assert!(
                d <= DEFAULT_RETRY_PERIOD.mul_f64(1.0 + JITTER_FACTOR),
                "{d:?}"
            );
        }
    }

    #[test]
    fn record_round_trips_through_a_lease_spec() {
        let t = to_micros(Timestamp::now());
        let record = LeaderElectionRecord {
            holder_identity: "a".into(),
            lease_duration_seconds: 15,
            acquire_time: Some(t),
            renew_time: Some(t),
            leader_transitions: 3,
            strategy: None,
            preferred_holder: None,
        };
        assert_eq!(LeaderElectionRecord::from_spec(&record.to_spec()), record);
        // Through JSON too: MicroTime keeps microseconds, so nothing is lost.
        let json = serde_json::to_value(record.to_spec()).unwrap();
        let back: LeaseSpec = serde_json::from_value(json).unwrap();
        assert_eq!(LeaderElectionRecord::from_spec(&back), record);
    }

    #[test]
    fn a_missing_spec_reads_as_an_unheld_zero_lease() {
        let record = LeaderElectionRecord::from_spec(&LeaseSpec::default());
        assert_eq!(record, LeaderElectionRecord::default());
    }

    #[test]
    fn lease_validity_uses_the_observed_duration_from_the_local_observation() {
        let now = Instant::now();
        let observed = Observed {
            record: Some(LeaseRecord {
                resource_version: "1".into(),
                record: LeaderElectionRecord {
                    holder_identity: "other".into(),
                    lease_duration_seconds: 15,
                    ..LeaderElectionRecord::default()
                },
            }),
            time: Some(now),
            reported_leader: String::new(),
        };
        assert!(lease_valid(&observed, now + Duration::from_millis(14_999)));
        assert!(!lease_valid(&observed, now + Duration::from_secs(15)));
        // A hostile negative duration is simply expired.
        let mut hostile = observed;
        if let Some(r) = hostile.record.as_mut() {
            r.record.lease_duration_seconds = -5;
        }
        assert!(!lease_valid(&hostile, now));
    }
}
