//! Zones, their disruption states, and the per-zone rate limit on `NoExecute` tainting
//! (Kubernetes' `handleDisruption`, `ComputeZoneState` and `RateLimitedTimedQueue`).
//!
//! Evictions are rate limited where they start: adding a `NoExecute` taint to a node is what
//! makes its pods go, so each zone has a queue of nodes waiting for that taint and a token
//! bucket that lets one through every `1 / rate` seconds. How fast depends on how sick the
//! zone looks:
//! - `Normal`: `node_eviction_rate`;
//! - `PartialDisruption` (at least `unhealthy_zone_threshold` of its nodes, and more than
//!   two, not Ready): `secondary_node_eviction_rate`, or not at all in a cluster of at most
//!   `large_cluster_size_threshold` nodes — evicting there would only overload the rest;
//! - `FullDisruption` (no node Ready): normal rate, *unless every zone is fully disrupted*.
//!   Then it is far more likely that the controller cannot see the nodes than that every node
//!   died at once, so all evictions stop and the controller's `NoExecute` taints come off
//!   until some node is heard from again. skerry's appliance is one zone, so there one zone
//!   fully disrupted means evictions stop.

use std::collections::{HashMap, VecDeque};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;

use super::NodeLifecycleConfig;

/// Tokens a zone's eviction bucket holds at most: one, so a zone that was quiet for an hour
/// still taints one node at a time rather than a burst (Kubernetes'
/// `EvictionRateLimiterBurst`).
pub const EVICTION_RATE_LIMITER_BURST: f64 = 1.0;

/// Zones with more than this many not-Ready nodes can be partially disrupted; with two or
/// fewer the ratio says nothing (two of three down in a three-node zone is 67 %, yet that is
/// exactly the failure evictions are for). Kubernetes hard-codes `notReadyNodes > 2`.
pub const PARTIAL_DISRUPTION_NOT_READY_MIN: usize = 3;

/// The label that keeps a node out of the zone's disruption arithmetic (Kubernetes'
/// `labelNodeDisruptionExclusion`).
pub const LABEL_EXCLUDE_DISRUPTION: &str = "node.kubernetes.io/exclude-disruption";

/// Zone labels, GA first (Kubernetes' `GetZoneKey` also reads the deprecated beta ones).
const REGION_LABELS: [&str; 2] = [
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/region",
];
const ZONE_LABELS: [&str; 2] = [
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/zone",
];

/// A zone's health as the controller judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneState {
    /// Seen for the first time; no limiter chosen yet.
    Initial,
    /// Few nodes not Ready.
    Normal,
    /// Many nodes not Ready.
    PartialDisruption,
    /// No node Ready.
    FullDisruption,
}

/// The zone of a node: `region:\0:zone` from its topology labels, `""` without them.
pub fn zone_key(node: &Node) -> String {
    let labels = node.metadata.labels.as_ref();
    let first = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| labels.and_then(|l| l.get(*k)).filter(|v| !v.is_empty()))
            .cloned()
            .unwrap_or_default()
    };
    let region = first(&REGION_LABELS);
    let zone = first(&ZONE_LABELS);
    if region.is_empty() && zone.is_empty() {
        String::new()
    } else {
        format!("{region}:\0:{zone}")
    }
}

/// Whether the node is left out of disruption checks.
pub fn excluded_from_disruption(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_EXCLUDE_DISRUPTION))
}

/// The number of not-Ready nodes of a zone and its state, from the `Ready` statuses of its
/// nodes (`None`: no `Ready` condition, which counts as not Ready).
pub fn compute_zone_state(
    ready: &[Option<&str>],
    config: &NodeLifecycleConfig,
) -> (usize, ZoneState) {
    let ready_nodes = ready.iter().filter(|s| **s == Some("True")).count();
    let not_ready = ready.len() - ready_nodes;
    let state = if ready_nodes == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready >= PARTIAL_DISRUPTION_NOT_READY_MIN
        && not_ready as f64 / ready.len() as f64 >= config.unhealthy_zone_threshold
    {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    };
    (not_ready, state)
}

/// The tainting rate for a zone of `zone_size` nodes in `state`.
pub fn eviction_rate(state: ZoneState, zone_size: usize, config: &NodeLifecycleConfig) -> f64 {
    match state {
        ZoneState::Initial | ZoneState::Normal | ZoneState::FullDisruption => {
            config.node_eviction_rate
        }
        ZoneState::PartialDisruption => {
            if zone_size > config.large_cluster_size_threshold {
                config.secondary_node_eviction_rate
            } else {
                0.0
            }
        }
    }
}

/// A token bucket over the controller's clock (client-go's `tokenBucketRateLimiter`; a rate
/// of zero is its `fakeNeverRateLimiter`).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    rate_per_second: f64,
    tokens: f64,
    refilled_at: Timestamp,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(rate_per_second: f64, now: Timestamp) -> TokenBucket {
        TokenBucket {
            rate_per_second,
            tokens: EVICTION_RATE_LIMITER_BURST,
            refilled_at: now,
        }
    }

    /// The rate.
    pub fn rate(&self) -> f64 {
        self.rate_per_second
    }

    /// Takes a token if one is there at `now`.
    pub fn try_accept(&mut self, now: Timestamp) -> bool {
        if self.rate_per_second <= 0.0 {
            return false;
        }
        let elapsed = now.duration_since(self.refilled_at).as_secs_f64().max(0.0);
        self.tokens =
            (self.tokens + elapsed * self.rate_per_second).min(EVICTION_RATE_LIMITER_BURST);
        self.refilled_at = self.refilled_at.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One zone's nodes waiting for a `NoExecute` taint, and the bucket that lets them through.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneTainter {
    /// The bucket.
    pub limiter: TokenBucket,
    /// Node names in the order they were queued; each at most once.
    pub queue: VecDeque<String>,
}

impl ZoneTainter {
    /// An empty queue with a full bucket at `rate`.
    pub fn new(rate: f64, now: Timestamp) -> ZoneTainter {
        ZoneTainter {
            limiter: TokenBucket::new(rate, now),
            queue: VecDeque::new(),
        }
    }

    /// Queues `node` unless it is queued; returns whether it was added.
    pub fn add(&mut self, node: &str) -> bool {
        if self.queue.iter().any(|n| n == node) {
            return false;
        }
        self.queue.push_back(node.to_string());
        true
    }

    /// Removes `node`; returns whether it was queued.
    pub fn remove(&mut self, node: &str) -> bool {
        let before = self.queue.len();
        self.queue.retain(|n| n != node);
        self.queue.len() != before
    }

    /// Switches to `rate` (Kubernetes' `SwapLimiter`): a new full bucket, drained at once if
    /// the old one was empty, so a rate change is not a free extra eviction.
    pub fn swap_limiter(&mut self, rate: f64, now: Timestamp) {
        if self.limiter.rate() == rate {
            return;
        }
        let mut next = TokenBucket::new(rate, now);
        if rate > 0.0 && !self.limiter.try_accept(now) {
            next.try_accept(now);
        }
        self.limiter = next;
    }

    /// Takes queued nodes, in order, while the bucket has tokens at `now`.
    pub fn take_ready(&mut self, now: Timestamp) -> Vec<String> {
        let mut taken = Vec::new();
        while !self.queue.is_empty() && self.limiter.try_accept(now) {
            if let Some(node) = self.queue.pop_front() {
                taken.push(node);
            }
        }
        taken
    }
}

/// What [`handle_disruption`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DisruptionChange {
    /// Every zone is now fully disrupted (it was not before): remove the controller's
    /// `NoExecute` taints everywhere.
    pub entered_full_disruption: bool,
    /// Some zone recovered after every zone was fully disrupted: every node's probe
    /// timestamp restarts now, so nobody is evicted for the silence of the outage.
    pub exited_full_disruption: bool,
    /// Every zone is fully disrupted (whether or not that is new): evictions stop.
    pub all_fully_disrupted: bool,
}

/// Computes each zone's new state from the `Ready` statuses of its nodes and swaps the
/// zones' limiters accordingly (Kubernetes' `handleDisruption`).
pub fn handle_disruption(
    zone_states: &mut HashMap<String, ZoneState>,
    tainters: &mut HashMap<String, ZoneTainter>,
    zone_ready: &HashMap<String, Vec<Option<&str>>>,
    now: Timestamp,
    config: &NodeLifecycleConfig,
) -> DisruptionChange {
    let mut new_states = HashMap::new();
    let mut all_are_fully_disrupted = true;
    for (zone, ready) in zone_ready {
        let (not_ready, state) = compute_zone_state(ready, config);
        if state != ZoneState::FullDisruption {
            all_are_fully_disrupted = false;
        }
        tracing::trace!(zone = %zone.escape_debug(), nodes = ready.len(), not_ready, ?state, "zone health");
        new_states.insert(zone.clone(), state);
        zone_states
            .entry(zone.clone())
            .or_insert(ZoneState::Initial);
    }
    // Zones with no nodes left are forgotten; the rest say whether all *were* disrupted.
    zone_states.retain(|zone, _| zone_ready.contains_key(zone));
    let all_were_fully_disrupted = zone_states
        .values()
        .all(|s| *s == ZoneState::FullDisruption);

    let mut change = DisruptionChange {
        all_fully_disrupted: all_are_fully_disrupted && !zone_ready.is_empty(),
        ..DisruptionChange::default()
    };
    if all_are_fully_disrupted && all_were_fully_disrupted {
        return change;
    }
    let zone_size = |zone: &str| zone_ready.get(zone).map_or(0, Vec::len);
    if all_are_fully_disrupted {
        tracing::warn!(
            "no node in any zone is Ready: stopping all evictions (control-plane disruption mode)"
        );
        for (zone, state) in zone_states.iter_mut() {
            if let Some(t) = tainters.get_mut(zone) {
                t.swap_limiter(0.0, now);
            }
            *state = ZoneState::FullDisruption;
        }
        change.entered_full_disruption = true;
        return change;
    }
    if all_were_fully_disrupted {
        tracing::info!("some nodes are Ready again: leaving control-plane disruption mode");
        change.exited_full_disruption = true;
    }
    for (zone, state) in zone_states.iter_mut() {
        let new_state = new_states.get(zone).copied().unwrap_or(ZoneState::Normal);
        if *state == new_state && !all_were_fully_disrupted {
            continue;
        }
        if *state != new_state {
            tracing::info!(zone = %zone.escape_debug(), from = ?*state, to = ?new_state, "zone changed state");
        }
        if let Some(t) = tainters.get_mut(zone) {
            t.swap_limiter(eviction_rate(new_state, zone_size(zone), config), now);
        }
        *state = new_state;
    }
    change
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millisecond(1_700_000_000_000 + millis).unwrap()
    }

    #[test]
    fn zone_states_follow_kubernetes() {
        let c = NodeLifecycleConfig::default();
        let t = Some("True");
        let f = Some("False");
        assert_eq!(compute_zone_state(&[t, t, f], &c), (1, ZoneState::Normal));
        assert_eq!(
            compute_zone_state(&[f, f, None], &c),
            (3, ZoneState::FullDisruption)
        );
        // Two of three is 67 % but only two: still Normal.
        assert_eq!(compute_zone_state(&[t, f, f], &c), (2, ZoneState::Normal));
        // Three of five is 60 % >= 55 %.
        assert_eq!(
            compute_zone_state(&[t, t, f, f, f], &c),
            (3, ZoneState::PartialDisruption)
        );
        // Three of six is 50 % < 55 %.
        assert_eq!(
            compute_zone_state(&[t, t, t, f, f, f], &c),
            (3, ZoneState::Normal)
        );
    }

    #[test]
    fn partial_disruption_slows_large_zones_and_stops_small_ones() {
        let c = NodeLifecycleConfig::default();
        assert_eq!(eviction_rate(ZoneState::PartialDisruption, 51, &c), 0.01);
        assert_eq!(eviction_rate(ZoneState::PartialDisruption, 50, &c), 0.0);
        assert_eq!(eviction_rate(ZoneState::Normal, 3, &c), 0.1);
    }

    #[test]
    fn bucket_lets_one_node_through_every_ten_seconds() {
        let mut t = ZoneTainter::new(0.1, at(0));
        for n in ["a", "b", "c"] {
            assert!(t.add(n));
        }
        assert!(!t.add("a"));
        assert_eq!(t.take_ready(at(0)), vec!["a"]);
        assert!(t.take_ready(at(9_000)).is_empty());
        assert_eq!(t.take_ready(at(10_000)), vec!["b"]);
        t.swap_limiter(0.0, at(60_000));
        assert!(
            t.take_ready(at(600_000)).is_empty(),
            "rate 0 never lets through"
        );
        // Back from a stop, the new bucket starts drained (the old one had nothing to
        // give): the first node goes one period later, not at once.
        t.swap_limiter(0.1, at(600_000));
        assert!(t.take_ready(at(600_000)).is_empty());
        assert_eq!(t.take_ready(at(610_000)), vec!["c"]);
    }

    #[test]
    fn every_zone_fully_disrupted_stops_evictions_and_recovery_resumes_them() {
        let c = NodeLifecycleConfig::default();
        let mut states = HashMap::new();
        let mut tainters = HashMap::from([(String::new(), ZoneTainter::new(0.1, at(0)))]);
        let healthy = HashMap::from([(
            String::new(),
            vec![Some("True"), Some("True"), Some("False")],
        )]);
        let change = handle_disruption(&mut states, &mut tainters, &healthy, at(0), &c);
        assert_eq!(change, DisruptionChange::default());
        assert_eq!(states[""], ZoneState::Normal);

        let down = HashMap::from([(String::new(), vec![Some("Unknown"); 3])]);
        let change = handle_disruption(&mut states, &mut tainters, &down, at(1), &c);
        assert!(change.entered_full_disruption && change.all_fully_disrupted);
        assert_eq!(states[""], ZoneState::FullDisruption);
        assert_eq!(tainters[""].limiter.rate(), 0.0);
        let change = handle_disruption(&mut states, &mut tainters, &down, at(2), &c);
        assert!(!change.entered_full_disruption && change.all_fully_disrupted);

        let change = handle_disruption(&mut states, &mut tainters, &healthy, at(3), &c);
        assert!(change.exited_full_disruption && !change.all_fully_disrupted);
        assert_eq!(states[""], ZoneState::Normal);
        assert_eq!(tainters[""].limiter.rate(), 0.1);
    }

    #[test]
    fn one_zone_down_among_healthy_ones_still_evicts() {
        let c = NodeLifecycleConfig::default();
        let mut states = HashMap::new();
        let mut tainters = HashMap::from([
            ("a".to_string(), ZoneTainter::new(0.1, at(0))),
            ("b".to_string(), ZoneTainter::new(0.1, at(0))),
        ]);
        let ready = HashMap::from([
            ("a".to_string(), vec![Some("Unknown"), Some("Unknown")]),
            ("b".to_string(), vec![Some("True")]),
        ]);
        let change = handle_disruption(&mut states, &mut tainters, &ready, at(0), &c);
        assert!(!change.all_fully_disrupted);
        assert_eq!(states["a"], ZoneState::FullDisruption);
        assert_eq!(tainters["a"].limiter.rate(), 0.1);
    }

    #[test]
    fn zone_keys() {
        let mut n = Node::default();
        assert_eq!(zone_key(&n), "");
        n.metadata.labels = Some(
            [("topology.kubernetes.io/zone".to_string(), "z1".to_string())]
                .into_iter()
                .collect(),
        );
        assert_eq!(zone_key(&n), ":\0:z1");
    }
}
