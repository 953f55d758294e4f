//! Latency percentiles, one workload's result on one server, and the medians across runs that
//! `compare` reports.
//!
//! Latencies are kept as exact microsecond samples and sorted once: the largest workload keeps
//! about a million (full-scale watch), 8 MB, so a histogram's approximation buys nothing here.

use std::time::Duration;

/// Error messages kept per workload so a report can say what went wrong. Larger makes reports
/// noisy when a server fails every request the same way; five shows the variety.
pub const ERROR_SAMPLES_MAX: usize = 5;

/// Percentiles of one workload's latency samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct LatencySummary {
    pub count: usize,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl LatencySummary {
    /// Summarizes samples by nearest rank; an empty set summarizes to zeros with `count` 0.
    pub fn from_samples(mut samples_us: Vec<u64>) -> Self {
        samples_us.sort_unstable();
        Self {
            count: samples_us.len(),
            p50_us: percentile(&samples_us, 50.0),
            p99_us: percentile(&samples_us, 99.0),
            max_us: samples_us.last().copied().unwrap_or(0),
        }
    }
}

/// Nearest-rank percentile of sorted samples: the smallest sample with at least `p`% of the
/// samples at or below it.
fn percentile(sorted_us: &[u64], p: f64) -> u64 {
    if sorted_us.is_empty() {
        return 0;
    }
    let rank = (p / 100.0 * sorted_us.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted_us.len()) - 1;
    sorted_us[index]
}

/// The `Extra` holding the server's CPU time per operation over the measured phase, in
/// microseconds; only `compare`, which owns the server processes, reports it.
pub const SERVER_CPU_EXTRA: &str = "server cpu";

/// A workload-specific number reported beside throughput and latency, such as the txn
/// conflict rate or the time of one full range scan.
#[derive(Clone, Debug)]
pub struct Extra {
    pub name: &'static str,
    pub value: f64,
    pub unit: &'static str,
}

/// One workload's outcome against one server in one run.
#[derive(Clone, Debug)]
pub struct WorkloadResult {
    /// Operations that completed and count toward throughput (txn conflicts included).
    pub ops: u64,
    /// Operations the plan asked for; fewer completed means the deadline or error limit hit.
    pub ops_planned: u64,
    /// Requests the server (or transport) answered with an error.
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Set when the workload stopped early, saying why.
    pub stopped_early: Option<String>,
    pub elapsed: Duration,
    pub latency: LatencySummary,
    pub extras: Vec<Extra>,
}

impl WorkloadResult {
    /// Completed operations per second of wall-clock time, 0 for an empty interval.
    pub fn throughput(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            self.ops as f64 / seconds
        } else {
            0.0
        }
    }

    pub fn extra(&self, name: &str) -> Option<f64> {
        self.extras
            .iter()
            .find(|extra| extra.name == name)
            .map(|extra| extra.value)
    }
}

/// Median of the values; the mean of the middle two for an even count, `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        Some(sorted[middle])
    } else {
        Some((sorted[middle - 1] + sorted[middle]) / 2.0)
    }
}

/// One workload's medians over the runs that completed on one target.
#[derive(Clone, Debug, Default)]
pub struct TargetSummary {
    pub runs_ok: usize,
    /// One line per failed run: `run N: reason`.
    pub failures: Vec<String>,
    pub throughput: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Errors summed over all runs.
    pub errors: u64,
    /// Runs that stopped before finishing their planned operations.
    pub runs_stopped_early: usize,
    /// Median of each extra over the runs that reported it, in first-reported order.
    pub extras: Vec<Extra>,
}

/// A workload's result in one run: the result, or why the run failed.
pub type RunOutcome = Result<WorkloadResult, String>;

impl TargetSummary {
    /// Medians over `runs`, where entry `i` is run `i + 1`.
    pub fn from_runs(runs: &[RunOutcome]) -> Self {
        let ok: Vec<&WorkloadResult> = runs.iter().filter_map(|r| r.as_ref().ok()).collect();
        let failures = runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().err().map(|e| format!("run {}: {e}", i + 1)))
            .collect();
        let collect =
            |f: &dyn Fn(&WorkloadResult) -> f64| ok.iter().map(|r| f(r)).collect::<Vec<_>>();
        // Names in first-seen order over all runs: an extra may be missing from one run (the
        // server CPU figure when /proc could not be read).
        let mut extras: Vec<Extra> = Vec::new();
        for extra in ok.iter().flat_map(|r| &r.extras) {
            if extras.iter().any(|e| e.name == extra.name) {
                continue;
            }
            let values: Vec<f64> = ok.iter().filter_map(|r| r.extra(extra.name)).collect();
            if let Some(value) = median(&values) {
                extras.push(Extra {
                    value,
                    ..extra.clone()
                });
            }
        }
        Self {
            runs_ok: ok.len(),
            failures,
            throughput: median(&collect(&|r| r.throughput())),
            p50_ms: median(&collect(&|r| r.latency.p50_us as f64 / 1_000.0)),
            p99_ms: median(&collect(&|r| r.latency.p99_us as f64 / 1_000.0)),
            errors: ok.iter().map(|r| r.errors).sum(),
            runs_stopped_early: ok.iter().filter(|r| r.stopped_early.is_some()).count(),
            extras,
        }
    }
}

impl TargetSummary {
    pub fn extra(&self, name: &str) -> Option<f64> {
        self.extras
            .iter()
            .find(|extra| extra.name == name)
            .map(|extra| extra.value)
    }
}

/// `numerator / denominator`, or `None` when either is missing or the denominator is 0.
pub fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    match (numerator, denominator) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

/// First/second throughput ratio of each run in which both targets completed, in run order.
/// The runs alternate which target goes first and follow each other within a minute, so a
/// pair shares the machine's mood; the spread of these ratios shows how much of a median
/// ratio is the machine rather than the servers.
pub fn paired_throughput_ratios(first: &[RunOutcome], second: &[RunOutcome]) -> Vec<f64> {
    first
        .iter()
        .zip(second)
        .filter_map(|(a, b)| match (a, b) {
            (Ok(a), Ok(b)) => ratio(Some(a.throughput()), Some(b.throughput())),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(ops: u64, millis: u64) -> RunOutcome {
        Ok(WorkloadResult {
            ops,
            ops_planned: ops,
            errors: 0,
            error_samples: Vec::new(),
            stopped_early: None,
            elapsed: std::time::Duration::from_millis(millis),
            latency: LatencySummary::from_samples(vec![1]),
            extras: Vec::new(),
        })
    }

    #[test]
    fn paired_ratios_skip_runs_where_either_side_failed() {
        let first = vec![
            result(200, 1_000),
            Err("crashed".into()),
            result(300, 1_000),
        ];
        let second = vec![result(100, 1_000), result(100, 1_000), result(100, 1_000)];
        assert_eq!(paired_throughput_ratios(&first, &second), vec![2.0, 3.0]);
        assert!(paired_throughput_ratios(&[], &second).is_empty());
    }

    #[test]
    fn percentile_nearest_rank() {
        let samples: Vec<u64> = (1..=100).collect();
        let summary = LatencySummary::from_samples(samples);
        assert_eq!(summary.p50_us, 50);
        assert_eq!(summary.p99_us, 99);
        assert_eq!(summary.max_us, 100);
        assert_eq!(LatencySummary::from_samples(vec![7]).p99_us, 7);
        assert_eq!(LatencySummary::from_samples(Vec::new()).count, 0);
    }

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
