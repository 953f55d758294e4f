//! The eviction thresholds and the pure state machine of the manager's synchronize (upstream
//! `pkg/kubelet/eviction/helpers.go`: `ParseThresholdConfig`, `thresholdsMet`,
//! `thresholdsFirstObservedAt`, `thresholdsMetGracePeriod`, `nodeConditions`,
//! `nodeConditionsLastObservedAt`, `nodeConditionsObservedSince`; the types of
//! `pkg/kubelet/eviction/api/types.go`).
//!
//! The trick it carries: two clocks. A soft threshold acts only once it has been met for its
//! grace period without a break (the first observation is remembered per threshold and
//! forgotten the moment it is not met), while a node condition, once raised, stays for the
//! pressure transition period after the last observation that raised it, so a node that
//! hovers around a threshold does not flap its condition (and its taint) every 10 s.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::machine::{
    FlagError, NANO, ThresholdValue, parse_eviction_thresholds, parse_map_flag, signals,
};
use crate::nodestatus::setters::conditions;
use skerry_api::validation::quantity::Quantity;

/// `--eviction-pressure-transition-period`'s default (`KubeletConfiguration`
/// `evictionPressureTransitionPeriod`, 5 minutes): how long a pressure condition outlives
/// the last observation of its threshold. Shorter flaps conditions and taints on a node at
/// the edge of a threshold; longer keeps BestEffort pods out for longer after the pressure.
pub const PRESSURE_TRANSITION_PERIOD_DEFAULT: Duration = Duration::from_secs(5 * 60);

/// One threshold (`evictionapi.Threshold`; the operator is always `LessThan`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Threshold {
    /// `memory.available`, `nodefs.available`...
    pub signal: String,
    /// The quantity or share of the capacity below which the threshold is met.
    pub value: ThresholdValue,
    /// Zero for a hard threshold; a soft one's `--eviction-soft-grace-period`.
    pub grace_period: Duration,
    /// `--eviction-minimum-reclaim`: what must be free beyond the threshold before it is
    /// resolved.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// `isHardEvictionThreshold`: no grace period.
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// The eviction manager's configuration (`eviction.Config`).
#[derive(Debug, Clone)]
pub struct EvictionConfig {
    /// Every threshold, hard ones first.
    pub thresholds: Vec<Threshold>,
    /// `--eviction-pressure-transition-period`.
    pub pressure_transition_period: Duration,
    /// `--eviction-max-pod-grace-period`: the most a pod evicted for a soft threshold gets
    /// (0: upstream's default, which then gives such a pod no grace at all).
    pub max_pod_grace_period: Duration,
}

/// `time.ParseDuration` for the flags: `90s`, `1m30s`, `1.5h`, `0`.
pub fn parse_go_duration(text: &str) -> Result<Duration, FlagError> {
    let invalid = || FlagError(format!("time: invalid duration {text:?}"));
    let rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() || rest.starts_with('-') {
        // A negative duration is refused by the callers with their own message; parse it
        // there.
        return Err(invalid());
    }
    let mut rest = rest;
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| FlagError(format!("time: missing unit in duration {text:?}")))?;
        let number: f64 = rest[..n].parse().map_err(|_| invalid())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => {
                return Err(FlagError(format!(
                    "time: unknown unit {unit:?} in duration {text:?}"
                )));
            }
        };
        total += number * scale;
        rest = &rest[u..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// `parseGracePeriods`: `memory.available=1m30s,...`.
fn parse_grace_periods(text: &str) -> Result<BTreeMap<String, Duration>, FlagError> {
    let mut out = BTreeMap::new();
    for (signal, value) in parse_map_flag(text, '=')? {
        if !signals::ALL.contains(&signal.as_str()) {
            return Err(FlagError(format!("unsupported eviction signal {signal}")));
        }
        if let Some(magnitude) = value.strip_prefix('-') {
            parse_go_duration(magnitude)?;
            return Err(FlagError(format!(
                "invalid eviction grace period specified: {value}, must be a positive value"
            )));
        }
        out.insert(signal, parse_go_duration(&value)?);
    }
    Ok(out)
}

/// `parseMinimumReclaims`: `memory.available=0Mi,nodefs.available=500Mi,imagefs.available=2%`.
fn parse_minimum_reclaims(text: &str) -> Result<BTreeMap<String, ThresholdValue>, FlagError> {
    let mut out = BTreeMap::new();
    for (signal, value) in parse_map_flag(text, '=')? {
        if !signals::ALL.contains(&signal.as_str()) {
            return Err(FlagError(format!("unsupported eviction signal {signal}")));
        }
        if value.ends_with('%') {
            let parsed = parse_eviction_thresholds(&format!("{signal}<{value}")).map_err(|_| {
                FlagError(format!(
                    "eviction percentage minimum reclaim {signal} must not be greater than 100%: {value}"
                ))
            })?;
            let v = parsed
                .get(&signal)
                .copied()
                .ok_or_else(|| FlagError(format!("unsupported eviction signal {signal}")))?;
            if v == ThresholdValue::PercentageMillionths(0) {
                return Err(FlagError(format!(
                    "eviction percentage minimum reclaim {signal} must be positive: {value}"
                )));
            }
            out.insert(signal, v);
            continue;
        }
        let q = Quantity::parse(&value).ok_or_else(|| {
            FlagError(format!(
                "failed to parse quantity {value:?} for eviction minimum reclaim {signal}"
            ))
        })?;
        if q.is_negative() {
            return Err(FlagError(format!(
                "negative eviction minimum reclaim specified for {signal}"
            )));
        }
        out.insert(signal, ThresholdValue::Quantity(q));
    }
    Ok(out)
}

/// `ParseThresholdConfig`: the hard thresholds, the soft ones each with its grace period (a
/// soft threshold without one is refused), the minimum reclaims on both; with `pods` in
/// `--enforce-node-allocatable`, the hard `memory.available` copied as
/// `allocatableMemory.available` (`addAllocatableThresholds`), measured on the pods' cgroup.
pub fn parse_threshold_config(
    enforce_pods: bool,
    hard: &str,
    soft: &str,
    soft_grace_period: &str,
    minimum_reclaim: &str,
) -> Result<Vec<Threshold>, FlagError> {
    let hard = parse_eviction_thresholds(hard)?;
    let soft = parse_eviction_thresholds(soft)?;
    let grace = parse_grace_periods(soft_grace_period)?;
    let reclaim = parse_minimum_reclaims(minimum_reclaim)?;
    let mut out: Vec<Threshold> = hard
        .into_iter()
        .map(|(signal, value)| Threshold {
            signal,
            value,
            grace_period: Duration::ZERO,
            min_reclaim: None,
        })
        .collect();
    for (signal, value) in soft {
        let Some(period) = grace.get(&signal) else {
            return Err(FlagError(format!(
                "grace period must be specified for the soft eviction threshold {signal}"
            )));
        };
        out.push(Threshold {
            signal,
            value,
            grace_period: *period,
            min_reclaim: None,
        });
    }
    for t in &mut out {
        t.min_reclaim = reclaim.get(&t.signal).copied();
    }
    if enforce_pods {
        let copies: Vec<Threshold> = out
            .iter()
            .filter(|t| t.signal == signals::MEMORY_AVAILABLE && t.is_hard())
            .map(|t| Threshold {
                signal: signals::ALLOCATABLE_MEMORY_AVAILABLE.to_string(),
                ..t.clone()
            })
            .collect();
        out.extend(copies);
    }
    Ok(out)
}

/// One signal's observation (`signalObservation`), in bytes, inodes or process ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// What is available now.
    pub available: i128,
    /// The total it is measured against.
    pub capacity: i128,
}

/// Observations by signal.
pub type Observations = BTreeMap<String, Observation>;

/// A threshold's quantity against a capacity, in whole units.
pub fn threshold_amount(value: &ThresholdValue, capacity: i128) -> i128 {
    value.against(Quantity(capacity * NANO)).0.div_euclid(NANO)
}

/// `thresholdsMet`: the thresholds whose signal is observed below them; with
/// `enforce_min_reclaim`, below them plus their minimum reclaim (a threshold stays met until
/// that much more is free). Unobserved signals never meet a threshold.
pub fn thresholds_met(
    thresholds: &[Threshold],
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = observations.get(&t.signal) else {
                return false;
            };
            let mut quantity = threshold_amount(&t.value, o.capacity);
            if enforce_min_reclaim && let Some(r) = &t.min_reclaim {
                quantity += threshold_amount(r, o.capacity);
            }
            quantity > o.available
        })
        .cloned()
        .collect()
}

/// `mergeThresholds`: `a` then what of `b` is not in `a`.
pub fn merge_thresholds(a: Vec<Threshold>, b: Vec<Threshold>) -> Vec<Threshold> {
    let mut out = a;
    for t in b {
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// When each threshold met now was first seen met, by threshold (`thresholdsObservedAt`).
pub type FirstObserved = Vec<(Threshold, Instant)>;

/// `thresholdsFirstObservedAt`: the earlier time kept for a threshold still met, `now` for a
/// new one; thresholds no longer met are forgotten.
pub fn thresholds_first_observed_at(
    met: &[Threshold],
    previous: &FirstObserved,
    now: Instant,
) -> FirstObserved {
    met.iter()
        .map(|t| {
            let at = previous
                .iter()
                .find(|(p, _)| p == t)
                .map_or(now, |(_, at)| *at);
            (t.clone(), at)
        })
        .collect()
}

/// `thresholdsMetGracePeriod`: those met for at least their grace period.
pub fn thresholds_met_grace_period(observed: &FirstObserved, now: Instant) -> Vec<Threshold> {
    observed
        .iter()
        .filter(|(t, at)| now.duration_since(*at) >= t.grace_period)
        .map(|(t, _)| t.clone())
        .collect()
}

/// `signalToNodeCondition`.
pub fn signal_condition(signal: &str) -> Option<&'static str> {
    match signal {
        signals::MEMORY_AVAILABLE | signals::ALLOCATABLE_MEMORY_AVAILABLE => {
            Some(conditions::MEMORY_PRESSURE)
        }
        signals::NODEFS_AVAILABLE
        | signals::NODEFS_INODES_FREE
        | signals::IMAGEFS_AVAILABLE
        | signals::IMAGEFS_INODES_FREE
        | signals::CONTAINERFS_AVAILABLE
        | signals::CONTAINERFS_INODES_FREE => Some(conditions::DISK_PRESSURE),
        signals::PID_AVAILABLE => Some(conditions::PID_PRESSURE),
        _ => None,
    }
}

/// `nodeConditions`: the conditions the thresholds call for, each once.
pub fn node_conditions(thresholds: &[Threshold]) -> Vec<&'static str> {
    let mut out = Vec::new();
    for c in thresholds
        .iter()
        .filter_map(|t| signal_condition(&t.signal))
    {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// When each condition was last called for (`nodeConditionsObservedAt`).
pub type LastObserved = BTreeMap<&'static str, Instant>;

/// `nodeConditionsLastObservedAt`: `now` for the conditions called for now, the old time for
/// the others.
pub fn node_conditions_last_observed_at(
    now_conditions: &[&'static str],
    previous: &LastObserved,
    now: Instant,
) -> LastObserved {
    let mut out = previous.clone();
    for c in now_conditions {
        out.insert(c, now);
    }
    out
}

/// `nodeConditionsObservedSince`: the conditions observed within the transition period,
/// in the order MemoryPressure, DiskPressure, PIDPressure.
pub fn node_conditions_observed_since(
    observed: &LastObserved,
    period: Duration,
    now: Instant,
) -> Vec<&'static str> {
    [
        conditions::MEMORY_PRESSURE,
        conditions::DISK_PRESSURE,
        conditions::PID_PRESSURE,
    ]
    .into_iter()
    .filter(|c| {
        observed
            .get(c)
            .is_some_and(|at| now.duration_since(*at) < period)
    })
    .collect()
}

/// `byEvictionPriority`: memory thresholds first (memory is what the OOM killer takes if
/// nothing is evicted in time), then the others in their order.
pub fn sort_by_eviction_priority(thresholds: &mut [Threshold]) {
    thresholds.sort_by_key(|t| signal_condition(&t.signal) != Some(conditions::MEMORY_PRESSURE));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> ThresholdValue {
        ThresholdValue::Quantity(Quantity::parse(s).expect("quantity"))
    }

    fn hard(signal: &str, v: ThresholdValue) -> Threshold {
        Threshold {
            signal: signal.into(),
            value: v,
            grace_period: Duration::ZERO,
            min_reclaim: None,
        }
    }

    #[test]
    fn the_flags_parse_as_parse_threshold_config_does() {
        let t = parse_threshold_config(
            true,
            "memory.available<150Mi",
            "memory.available<300Mi,nodefs.available<15%",
            "memory.available=30s,nodefs.available=1m30s",
            "memory.available=0Mi,nodefs.available=500Mi",
        )
        .expect("valid");
        assert_eq!(t.len(), 4);
        assert_eq!(t[0], {
            let mut h = hard("memory.available", q("150Mi"));
            h.min_reclaim = Some(q("0Mi"));
            h
        });
        assert_eq!(t[1].signal, "memory.available");
        assert_eq!(t[1].grace_period, Duration::from_secs(30));
        assert_eq!(t[2].signal, "nodefs.available");
        assert_eq!(t[2].value, ThresholdValue::PercentageMillionths(150_000));
        assert_eq!(t[2].grace_period, Duration::from_secs(90));
        assert_eq!(t[2].min_reclaim, Some(q("500Mi")));
        assert_eq!(t[3].signal, "allocatableMemory.available");
        assert!(t[3].is_hard());
        assert_eq!(t[3].value, q("150Mi"));
        // Without `pods` enforced, no allocatable copy.
        assert_eq!(
            parse_threshold_config(false, "memory.available<150Mi", "", "", "")
                .expect("valid")
                .len(),
            1
        );
        for (soft, grace, reclaim, err) in [
            (
                "memory.available<1Gi",
                "",
                "",
                "grace period must be specified for the soft eviction threshold memory.available",
            ),
            (
                "",
                "memory.free=1m",
                "",
                "unsupported eviction signal memory.free",
            ),
            (
                "",
                "memory.available=-1m",
                "",
                "invalid eviction grace period specified: -1m, must be a positive value",
            ),
            (
                "",
                "memory.available=soon",
                "",
                "time: invalid duration \"soon\"",
            ),
            (
                "",
                "",
                "memory.available=-1Mi",
                "negative eviction minimum reclaim specified for memory.available",
            ),
            (
                "",
                "",
                "nodefs.available=0%",
                "eviction percentage minimum reclaim nodefs.available must be positive: 0%",
            ),
            (
                "",
                "",
                "nodefs.available=120%",
                "eviction percentage minimum reclaim nodefs.available must not be greater than 100%: 120%",
            ),
        ] {
            assert_eq!(
                parse_threshold_config(true, "", soft, grace, reclaim)
                    .expect_err(err)
                    .0,
                err
            );
        }
    }

    #[test]
    fn thresholds_met_with_and_without_min_reclaim() {
        let mut t = hard("memory.available", q("1Gi"));
        t.min_reclaim = Some(q("500Mi"));
        let pct = hard(
            "nodefs.available",
            ThresholdValue::PercentageMillionths(100_000),
        );
        let all = vec![t.clone(), pct.clone()];
        let obs = |mem: i128, fs: i128| -> Observations {
            BTreeMap::from([
                (
                    "memory.available".to_string(),
                    Observation {
                        available: mem,
                        capacity: 8 << 30,
                    },
                ),
                (
                    "nodefs.available".to_string(),
                    Observation {
                        available: fs,
                        capacity: 1000,
                    },
                ),
            ])
        };
        // Below both: both met.
        assert_eq!(thresholds_met(&all, &obs(500 << 20, 99), false), all);
        // Exactly at the threshold is not below it.
        assert!(thresholds_met(&all, &obs(1 << 30, 100), false).is_empty());
        // Above the threshold but within its minimum reclaim: met only when enforced.
        let between = obs((1 << 30) + (100 << 20), 500);
        assert!(thresholds_met(&all, &between, false).is_empty());
        assert_eq!(thresholds_met(&all, &between, true), vec![t]);
        // A signal not observed meets nothing.
        assert!(thresholds_met(&[pct], &Observations::new(), false).is_empty());
    }

    #[test]
    fn soft_thresholds_wait_for_their_grace_period_and_forget_a_break() {
        let soft = Threshold {
            grace_period: Duration::from_secs(30),
            ..hard("memory.available", q("1Gi"))
        };
        let hard_t = hard("nodefs.available", q("1Gi"));
        let t0 = Instant::now();
        let first = thresholds_first_observed_at(&[soft.clone(), hard_t.clone()], &vec![], t0);
        // A hard threshold acts at once, a soft one not yet.
        assert_eq!(thresholds_met_grace_period(&first, t0), vec![hard_t]);
        let t20 = t0 + Duration::from_secs(20);
        let again = thresholds_first_observed_at(std::slice::from_ref(&soft), &first, t20);
        assert!(thresholds_met_grace_period(&again, t20).is_empty());
        let t31 = t0 + Duration::from_secs(31);
        let again = thresholds_first_observed_at(std::slice::from_ref(&soft), &again, t31);
        assert_eq!(thresholds_met_grace_period(&again, t31), vec![soft.clone()]);
        // Not met once: forgotten, the grace period starts over.
        let broken = thresholds_first_observed_at(&[], &again, t31);
        let t40 = t0 + Duration::from_secs(40);
        let back = thresholds_first_observed_at(std::slice::from_ref(&soft), &broken, t40);
        assert!(thresholds_met_grace_period(&back, t40).is_empty());
    }

    #[test]
    fn conditions_outlive_their_thresholds_by_the_transition_period() {
        let period = Duration::from_secs(300);
        let t0 = Instant::now();
        let met = vec![
            hard("allocatableMemory.available", q("1Gi")),
            hard("memory.available", q("1Gi")),
            hard("nodefs.inodesFree", q("100")),
            hard("pid.available", q("100")),
        ];
        assert_eq!(
            node_conditions(&met),
            vec!["MemoryPressure", "DiskPressure", "PIDPressure"]
        );
        let seen =
            node_conditions_last_observed_at(&node_conditions(&met[..1]), &BTreeMap::new(), t0);
        assert_eq!(
            node_conditions_observed_since(&seen, period, t0),
            vec!["MemoryPressure"]
        );
        // No longer met: still reported until the period has passed since the last sighting.
        let t1 = t0 + Duration::from_secs(299);
        let seen = node_conditions_last_observed_at(&[], &seen, t1);
        assert_eq!(
            node_conditions_observed_since(&seen, period, t1),
            vec!["MemoryPressure"]
        );
        let t2 = t0 + period;
        assert!(node_conditions_observed_since(&seen, period, t2).is_empty());
    }

    #[test]
    fn memory_thresholds_are_reclaimed_first() {
        let mut t = vec![
            hard("nodefs.available", q("1Gi")),
            hard("pid.available", q("10")),
            hard("allocatableMemory.available", q("1Gi")),
        ];
        sort_by_eviction_priority(&mut t);
        assert_eq!(t[0].signal, "allocatableMemory.available");
        assert_eq!(t[1].signal, "nodefs.available");
    }

    #[test]
    fn go_durations() {
        assert_eq!(
            parse_go_duration("1m30s").ok(),
            Some(Duration::from_secs(90))
        );
        assert_eq!(parse_go_duration("0").ok(), Some(Duration::ZERO));
        assert_eq!(
            parse_go_duration("1.5h").ok(),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            parse_go_duration("10").unwrap_err().0,
            "time: missing unit in duration \"10\""
        );
        assert_eq!(
            parse_go_duration("3d").unwrap_err().0,
            "time: unknown unit \"d\" in duration \"3d\""
        );
    }
}
