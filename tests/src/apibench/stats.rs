//! Order statistics for the benchmark: medians across runs and nearest-rank percentiles of
//! latencies within one run.
//!
//! Invariant: every function here takes its input as given and never averages, so a noisy
//! run moves a median by at most one rank (the reason the issue asks for medians).

use std::time::Duration;

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of durations already sorted ascending;
/// `None` when empty.
///
/// # Panics
/// If `p` is outside (0, 100] (a programmer error).
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    assert!(p > 0.0 && p <= 100.0, "percentile {p} outside (0, 100]");
    debug_assert!(sorted.is_sorted(), "percentile input must be sorted");
    if sorted.is_empty() {
        return None;
    }
    // Nearest rank: the smallest value with at least p% of the values at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Milliseconds as a float, for tables and JSON.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&values, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&values, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&values, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(
            percentile(&values[..1], 99.0),
            Some(Duration::from_millis(1))
        );
        assert_eq!(percentile(&[], 99.0), None);
    }
}
