//! Expectations: how a controller waits for its own writes to come back (`docs/tricks.md` #27,
//! kube-controller-manager's `ControllerExpectations` and `UIDTrackingControllerExpectations`
//! in `pkg/controller/controller_utils.go`).
//!
//! A controller decides from its informer cache, and the cache learns of the controller's own
//! writes only when they come back through the watch. Between the write and the event the
//! cache still shows the old world: a ReplicaSet that just created three pods still sees none,
//! and a second sync in that window would create three more. So before it writes, the
//! controller *raises* an expectation ("I will see 3 creations for `ns/web`"), the pod event
//! handlers *lower* it as the ADDED (or DELETED) events arrive, and `sync` acts only while the
//! expectation is [`satisfied`](ControllerExpectations::satisfied); until then it only
//! refreshes status.
//!
//! Invariants:
//! - a record is *satisfied* when both counts are `<= 0` (observations may overshoot: an event
//!   for a pod the controller did not create, e.g. after a relist, lowers a count below zero),
//!   when it is older than [`EXPECTATIONS_TIMEOUT`], or when there is none;
//! - with [`UidTrackingControllerExpectations`] a deletion lowers the count only for a UID
//!   that was expected and only once: the update that sets `deletionTimestamp`, the DELETE
//!   event and a relist tombstone of the same pod are one observation, and a pod deleted by
//!   someone else is none.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long a raised expectation may stay unmet before `satisfied` says yes anyway: a watch
/// event that is lost (a dropped connection the reflector healed by relisting, a pod created
/// and deleted before the watch saw it) must not wedge a controller forever. Kubernetes'
/// `ExpectationsTimeout` is 5 minutes: long enough that a slow but healthy watch never trips
/// it (which would double-create), short enough that a stuck controller heals unattended.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// A source of monotonic time, injectable so tests can step past [`EXPECTATIONS_TIMEOUT`].
pub trait Clock: Send + Sync + 'static {
    /// Now.
    fn now(&self) -> Instant;
}

/// The real clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    /// The current reading; a mutex because tests advance it while controllers read it.
    now: Mutex<Instant>,
}

impl ManualClock {
    /// A clock reading the real time now.
    pub fn new() -> ManualClock {
        ManualClock {
            now: Mutex::new(Instant::now()),
        }
    }
    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.now.lock() += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock()
    }
}

/// One controller's outstanding creations and deletions, and when they were set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expectation {
    /// Creations still to be observed (may go negative).
    pub add: i64,
    /// Deletions still to be observed (may go negative).
    pub del: i64,
    /// When the record was set (`SetExpectations`); raising or lowering keeps it.
    pub timestamp: Instant,
}

impl Expectation {
    /// Whether every expected write has been observed.
    pub fn fulfilled(&self) -> bool {
        self.add <= 0 && self.del <= 0
    }
}

/// Outstanding creations and deletions by controller key (`namespace/name`), counted.
pub struct ControllerExpectations {
    clock: Arc<dyn Clock>,
    /// The records. A mutex, not a channel to an owner task: every operation is a few map
    /// operations with no `.await` inside, called from the informer's handler tasks and from
    /// the sync workers alike.
    records: Mutex<HashMap<String, Expectation>>,
}

impl ControllerExpectations {
    /// Expectations over the real clock.
    pub fn new() -> ControllerExpectations {
        ControllerExpectations::with_clock(Arc::new(SystemClock))
    }

    /// Expectations over `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> ControllerExpectations {
        ControllerExpectations {
            clock,
            records: Mutex::new(HashMap::new()),
        }
    }

    /// The record for `key`, if any.
    pub fn get(&self, key: &str) -> Option<Expectation> {
        self.records.lock().get(key).copied()
    }

    /// Replaces the record for `key` with `add` creations and `del` deletions, timestamped now
    /// (Kubernetes' `SetExpectations`).
    pub fn set_expectations(&self, key: &str, add: i64, del: i64) {
        let timestamp = self.clock.now();
        self.records.lock().insert(
            key.to_string(),
            Expectation {
                add,
                del,
                timestamp,
            },
        );
    }

    /// Expects `adds` creations for `key`, replacing any earlier record. Call it *before*
    /// the writes, so an ADDED event that beats the call's return still finds it.
    pub fn expect_creations(&self, key: &str, adds: usize) {
        self.set_expectations(key, saturating_i64(adds), 0);
    }

    /// Expects `dels` deletions for `key`, replacing any earlier record.
    pub fn expect_deletions(&self, key: &str, dels: usize) {
        self.set_expectations(key, 0, saturating_i64(dels));
    }

    /// Adds to an existing record (none: nothing happens).
    pub fn raise_expectations(&self, key: &str, adds: i64, dels: i64) {
        if let Some(e) = self.records.lock().get_mut(key) {
            e.add += adds;
            e.del += dels;
        }
    }

    /// Subtracts from an existing record: an observation, or writes that failed and will
    /// never be observed (none: nothing happens).
    pub fn lower_expectations(&self, key: &str, adds: i64, dels: i64) {
        self.raise_expectations(key, -adds, -dels);
    }

    /// One creation for `key` came back through the watch.
    pub fn creation_observed(&self, key: &str) {
        self.lower_expectations(key, 1, 0);
    }

    /// One deletion for `key` came back through the watch.
    pub fn deletion_observed(&self, key: &str) {
        self.lower_expectations(key, 0, 1);
    }

    /// Whether the controller for `key` may act on its cache: it has no record, every
    /// expected write was observed, or the record is older than [`EXPECTATIONS_TIMEOUT`].
    pub fn satisfied(&self, key: &str) -> bool {
        let Some(e) = self.get(key) else {
            // A new controller, or one whose expectations were deleted: nothing is in flight.
            return true;
        };
        if e.fulfilled() {
            return true;
        }
        let age = self.clock.now().saturating_duration_since(e.timestamp);
        if age > EXPECTATIONS_TIMEOUT {
            tracing::info!(
                controller = %key,
                add = e.add,
                del = e.del,
                age_s = age.as_secs(),
                "expectations expired; a watch event was probably lost"
            );
            return true;
        }
        false
    }

    /// Forgets `key` (its controller was deleted).
    pub fn delete_expectations(&self, key: &str) {
        self.records.lock().remove(key);
    }
}

impl Default for ControllerExpectations {
    fn default() -> Self {
        ControllerExpectations::new()
    }
}

/// [`ControllerExpectations`] whose deletions are tracked by pod UID: only the deletion of a
/// pod the controller chose lowers the count, and only once.
pub struct UidTrackingControllerExpectations {
    counts: ControllerExpectations,
    /// The UIDs whose deletion is still expected, by controller key. One mutex for the check
    /// of a UID and the lowering of the count, so two observations of the same UID racing on
    /// two handler tasks cannot both lower it.
    uids: Mutex<HashMap<String, HashSet<String>>>,
}

impl UidTrackingControllerExpectations {
    /// Expectations over the real clock.
    pub fn new() -> UidTrackingControllerExpectations {
        UidTrackingControllerExpectations::with_clock(Arc::new(SystemClock))
    }

    /// Expectations over `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> UidTrackingControllerExpectations {
        UidTrackingControllerExpectations {
            counts: ControllerExpectations::with_clock(clock),
            uids: Mutex::new(HashMap::new()),
        }
    }

    /// The counted record for `key`, if any.
    pub fn get(&self, key: &str) -> Option<Expectation> {
        self.counts.get(key)
    }

    /// The UIDs whose deletion `key` still expects.
    pub fn expected_deletion_uids(&self, key: &str) -> HashSet<String> {
        self.uids.lock().get(key).cloned().unwrap_or_default()
    }

    /// Expects `adds` creations for `key` (replacing the record; the UID set is kept, as
    /// Kubernetes does, since a record is replaced only once it was satisfied).
    pub fn expect_creations(&self, key: &str, adds: usize) {
        self.counts.expect_creations(key, adds);
    }

    /// One creation for `key` came back.
    pub fn creation_observed(&self, key: &str) {
        self.counts.creation_observed(key);
    }

    /// Expects the deletion of the pods with `uids` (duplicates count once), replacing the
    /// record.
    pub fn expect_deletions(&self, key: &str, uids: impl IntoIterator<Item = String>) {
        let set: HashSet<String> = uids.into_iter().collect();
        let mut all = self.uids.lock();
        if all.get(key).is_some_and(|s| !s.is_empty()) {
            // Only a satisfied (or expired) record is replaced, so the leftovers are deletions
            // that were lost; Kubernetes logs the same clobbering.
            tracing::debug!(controller = %key, "replacing unobserved deletion UIDs");
        }
        self.counts.expect_deletions(key, set.len());
        all.insert(key.to_string(), set);
    }

    /// The pod with `uid`, owned by `key`, was seen deleted (or being deleted). Lowers the
    /// count only if `uid` was expected and not yet observed; returns whether it did.
    pub fn deletion_observed(&self, key: &str, uid: &str) -> bool {
        let mut all = self.uids.lock();
        let Some(set) = all.get_mut(key) else {
            return false;
        };
        if !set.remove(uid) {
            return false;
        }
        self.counts.deletion_observed(key);
        true
    }

    /// Subtracts from the counts (failed writes). `dels` here is a count: prefer
    /// [`Self::deletion_observed`] for a failed delete, which also forgets the UID.
    pub fn lower_expectations(&self, key: &str, adds: i64, dels: i64) {
        self.counts.lower_expectations(key, adds, dels);
    }

    /// See [`ControllerExpectations::satisfied`].
    pub fn satisfied(&self, key: &str) -> bool {
        self.counts.satisfied(key)
    }

    /// Forgets `key` and its UIDs.
    pub fn delete_expectations(&self, key: &str) {
        let mut all = self.uids.lock();
        all.remove(key);
        self.counts.delete_expectations(key);
    }
}

impl Default for UidTrackingControllerExpectations {
    fn default() -> Self {
        UidTrackingControllerExpectations::new()
    }
}

fn saturating_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    fn manual() -> (Arc<ManualClock>, ControllerExpectations) {
        let clock = Arc::new(ManualClock::new());
        let e = ControllerExpectations::with_clock(clock.clone());
        (clock, e)
    }

    #[test]
    fn no_record_is_satisfied() {
        let (_, e) = manual();
        assert!(e.satisfied("ns/rs"));
    }

    #[test]
    fn creations_satisfied_only_when_all_observed() {
        let (_, e) = manual();
        e.expect_creations("ns/rs", 3);
        assert!(!e.satisfied("ns/rs"));
        e.creation_observed("ns/rs");
        e.creation_observed("ns/rs");
        assert!(!e.satisfied("ns/rs"));
        e.creation_observed("ns/rs");
        assert!(e.satisfied("ns/rs"));
        // Overshooting (a pod someone else made, seen after a relist) stays satisfied.
        e.creation_observed("ns/rs");
        assert!(e.satisfied("ns/rs"));
        assert_eq!(e.get("ns/rs").map(|x| x.add), Some(-1));
    }

    #[test]
    fn both_counts_must_reach_zero() {
        let (_, e) = manual();
        e.set_expectations("k", 1, 1);
        e.creation_observed("k");
        assert!(!e.satisfied("k"), "a deletion is still outstanding");
        e.deletion_observed("k");
        assert!(e.satisfied("k"));
    }

    #[test]
    fn lowered_for_failed_writes() {
        let (_, e) = manual();
        e.expect_creations("k", 5);
        e.lower_expectations("k", 3, 0);
        assert_eq!(e.get("k").map(|x| x.add), Some(2));
        e.raise_expectations("k", 1, 0);
        assert_eq!(e.get("k").map(|x| x.add), Some(3));
        // Lowering or raising a missing record does not invent one.
        e.lower_expectations("other", 1, 1);
        assert_eq!(e.get("other"), None);
    }

    #[test]
    fn unmet_expectations_expire_after_the_timeout() {
        let (clock, e) = manual();
        e.expect_creations("k", 2);
        clock.advance(EXPECTATIONS_TIMEOUT);
        assert!(!e.satisfied("k"), "exactly the timeout is not yet past it");
        clock.advance(Duration::from_secs(1));
        assert!(
            e.satisfied("k"),
            "a lost event must not wedge the controller"
        );
        // A fresh record restarts the clock.
        e.expect_creations("k", 2);
        assert!(!e.satisfied("k"));
    }

    #[test]
    fn lowering_does_not_refresh_the_timestamp() {
        let (clock, e) = manual();
        e.expect_creations("k", 2);
        clock.advance(Duration::from_secs(200));
        e.creation_observed("k");
        clock.advance(Duration::from_secs(101));
        assert!(
            e.satisfied("k"),
            "timeout counts from when the record was set"
        );
    }

    #[test]
    fn delete_forgets() {
        let (_, e) = manual();
        e.expect_creations("k", 1);
        e.delete_expectations("k");
        assert!(e.satisfied("k"));
        assert_eq!(e.get("k"), None);
    }

    #[test]
    fn deletion_counted_once_per_expected_uid() {
        let u = UidTrackingControllerExpectations::with_clock(Arc::new(ManualClock::new()));
        u.expect_deletions("k", ["a".to_string(), "b".to_string()]);
        assert_eq!(u.get("k").map(|x| x.del), Some(2));
        // The update that sets deletionTimestamp...
        assert!(u.deletion_observed("k", "a"));
        // ...then the DELETE event, then a relist tombstone: the same pod, counted once.
        assert!(!u.deletion_observed("k", "a"));
        assert!(!u.deletion_observed("k", "a"));
        assert_eq!(u.get("k").map(|x| x.del), Some(1));
        assert!(!u.satisfied("k"));
        // A pod someone else deleted does not count.
        assert!(!u.deletion_observed("k", "z"));
        assert!(!u.satisfied("k"));
        assert!(u.deletion_observed("k", "b"));
        assert!(u.satisfied("k"));
        assert!(u.expected_deletion_uids("k").is_empty());
    }

    #[test]
    fn duplicate_uids_expected_once() {
        let u = UidTrackingControllerExpectations::new();
        u.expect_deletions("k", ["a".to_string(), "a".to_string()]);
        assert_eq!(u.get("k").map(|x| x.del), Some(1));
        assert!(u.deletion_observed("k", "a"));
        assert!(u.satisfied("k"));
    }

    #[test]
    fn uid_tracking_delete_forgets_uids() {
        let u = UidTrackingControllerExpectations::new();
        u.expect_deletions("k", ["a".to_string()]);
        u.delete_expectations("k");
        assert!(u.satisfied("k"));
        assert!(!u.deletion_observed("k", "a"));
        assert!(u.expected_deletion_uids("k").is_empty());
    }

    #[test]
    fn uid_tracking_creations() {
        let u = UidTrackingControllerExpectations::new();
        u.expect_creations("k", 2);
        u.creation_observed("k");
        assert!(!u.satisfied("k"));
        u.lower_expectations("k", 1, 0);
        assert!(u.satisfied("k"));
    }
}
