//! `plot.svg`: throughput and latency over time with the fault windows shaded, drawn the way
//! Jepsen's `perf` graphs are (rate of ok / failed / unknown ops per second on top; a scatter
//! of op latencies with per-second p50 and p99 lines below, on a log scale), with each
//! compaction the compactor asked for marked by a dotted line across the rate panel. Hand-written SVG:
//! the picture is simple and a plotting dependency would outweigh it.

use std::fmt::Write;

use super::Recorded;
use super::nemesis::{FaultKind, FaultWindow};
use crate::check::{CompactOutcome, Compaction, Op, Outcome};

/// The picture's size in SVG units (pixels at 100 %): wide enough for a minute at 15 px per
/// second, tall enough for two readable panels.
const WIDTH: f64 = 1100.0;
const HEIGHT: f64 = 680.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 170.0;
const RATE_TOP: f64 = 50.0;
const RATE_BOTTOM: f64 = 300.0;
const LATENCY_TOP: f64 = 360.0;
const LATENCY_BOTTOM: f64 = 630.0;

/// Bucket width for rates and percentiles.
const BUCKET_NS: u64 = 1_000_000_000;

/// Points drawn in the latency scatter at most; a longer history is sampled evenly. Keeps the
/// file under a megabyte while still showing the shape. Semi-arbitrary.
const SCATTER_POINTS_MAX: usize = 6_000;

const OK_COLOR: &str = "#2a9d3a";
const FAILED_COLOR: &str = "#e08a00";
const UNKNOWN_COLOR: &str = "#d62728";
const COMPACTION_COLOR: &str = "#555555";
/// Dotted, so a compaction line is not taken for a latency line.
const COMPACTION_DASH: &str = r#" stroke-dasharray="2 3""#;

fn fault_color(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::Partition => "#4c72b0",
        FaultKind::Kill => "#c44e52",
        FaultKind::Pause => "#8172b2",
        FaultKind::Membership => "#55a868",
    }
}

/// Per-bucket counts and latencies.
#[derive(Debug, Default, Clone)]
struct Bucket {
    ok: u64,
    failed: u64,
    unknown: u64,
    latencies_ms: Vec<f64>,
}

fn latency_ms(op: &Op) -> Option<f64> {
    op.complete
        .map(|complete| complete.saturating_sub(op.invoke) as f64 / 1e6)
}

fn buckets(history: &[Op], end_ns: u64) -> Vec<Bucket> {
    let count = usize::try_from(end_ns / BUCKET_NS + 1).unwrap_or(1);
    let mut buckets = vec![Bucket::default(); count];
    let index = |ns: u64| usize::try_from(ns / BUCKET_NS).unwrap_or(0).min(count - 1);
    for op in history {
        match (&op.result, op.complete) {
            (Outcome::Ok(_), Some(complete)) => {
                let bucket = &mut buckets[index(complete)];
                bucket.ok += 1;
                bucket.latencies_ms.extend(latency_ms(op));
            }
            (Outcome::Failed, complete) => {
                buckets[index(complete.unwrap_or(op.invoke))].failed += 1;
            }
            _ => buckets[index(op.invoke)].unknown += 1,
        }
    }
    for bucket in &mut buckets {
        bucket.latencies_ms.sort_by(f64::total_cmp);
    }
    buckets
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// Renders the plot of a run.
pub fn render(recorded: &Recorded, title: &str) -> String {
    let end_ns = recorded
        .history
        .iter()
        .filter_map(|op| op.complete)
        .chain(recorded.history.iter().map(|op| op.invoke))
        .chain([recorded.end_ns])
        .max()
        .unwrap_or(0)
        .max(BUCKET_NS);
    let seconds = end_ns as f64 / 1e9;
    let x =
        |ns: u64| MARGIN_LEFT + (WIDTH - MARGIN_LEFT - MARGIN_RIGHT) * (ns as f64 / 1e9) / seconds;
    let buckets = buckets(&recorded.history, end_ns);

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/><text x="{MARGIN_LEFT}" y="22" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    draw_faults(&mut svg, &recorded.faults, end_ns, &x);
    draw_compactions(&mut svg, &recorded.compactions, &x);

    // Throughput panel.
    let rate_max = buckets
        .iter()
        .map(|b| b.ok.max(b.failed).max(b.unknown))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let rate_max = nice_ceiling(rate_max);
    let rate_y = |rate: f64| RATE_BOTTOM - (RATE_BOTTOM - RATE_TOP) * rate / rate_max;
    draw_frame(&mut svg, RATE_TOP, RATE_BOTTOM, "ops/s");
    for step in 0..=4 {
        let rate = rate_max * f64::from(step) / 4.0;
        axis_label(&mut svg, rate_y(rate), &format!("{rate:.0}"));
    }
    let bucket_x = |index: usize| x(index as u64 * BUCKET_NS + BUCKET_NS / 2);
    for (color, pick) in [
        (OK_COLOR, (|b: &Bucket| b.ok) as fn(&Bucket) -> u64),
        (FAILED_COLOR, |b: &Bucket| b.failed),
        (UNKNOWN_COLOR, |b: &Bucket| b.unknown),
    ] {
        let points: Vec<String> = buckets
            .iter()
            .enumerate()
            .map(|(i, b)| format!("{:.1},{:.1}", bucket_x(i), rate_y(pick(b) as f64)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            points.join(" ")
        );
    }

    // Latency panel, log scale.
    let latencies: Vec<f64> = recorded
        .history
        .iter()
        .filter_map(latency_ms)
        .filter(|ms| *ms > 0.0)
        .collect();
    let low = latencies.iter().copied().fold(f64::INFINITY, f64::min);
    let high = latencies.iter().copied().fold(0.0, f64::max);
    let (decade_low, decade_high) = if latencies.is_empty() {
        (-1, 4)
    } else {
        let low = low.log10().floor() as i32;
        (low, (high.log10().ceil() as i32).max(low + 1))
    };
    let latency_y = |ms: f64| {
        let span = f64::from(decade_high - decade_low);
        let position = (ms.max(1e-9).log10() - f64::from(decade_low)) / span;
        LATENCY_BOTTOM - (LATENCY_BOTTOM - LATENCY_TOP) * position.clamp(0.0, 1.0)
    };
    draw_frame(&mut svg, LATENCY_TOP, LATENCY_BOTTOM, "latency (ms)");
    for decade in decade_low..=decade_high {
        let ms = 10f64.powi(decade);
        axis_label(&mut svg, latency_y(ms), &format_ms(ms));
    }
    let stride = recorded.history.len().div_ceil(SCATTER_POINTS_MAX).max(1);
    for op in recorded.history.iter().step_by(stride) {
        let (color, ms) = match (&op.result, latency_ms(op)) {
            (Outcome::Ok(_), Some(ms)) => (OK_COLOR, ms),
            (Outcome::Failed, Some(ms)) => (FAILED_COLOR, ms),
            // No answer: drawn at the top, where its latency is "at least the timeout".
            _ => (UNKNOWN_COLOR, 10f64.powi(decade_high)),
        };
        let _ = writeln!(
            svg,
            r#"<circle cx="{:.1}" cy="{:.1}" r="1.3" fill="{color}" fill-opacity="0.35"/>"#,
            x(op.invoke),
            latency_y(ms)
        );
    }
    for (q, dash) in [(0.5, ""), (0.99, r#" stroke-dasharray="4 2""#)] {
        // One polyline per run of buckets with answers, so a gap (nothing answered during a
        // fault) shows as a gap.
        let mut runs: Vec<Vec<String>> = vec![Vec::new()];
        for (i, bucket) in buckets.iter().enumerate() {
            match quantile(&bucket.latencies_ms, q) {
                Some(ms) => {
                    if let Some(run) = runs.last_mut() {
                        run.push(format!("{:.1},{:.1}", bucket_x(i), latency_y(ms)));
                    }
                }
                None => runs.push(Vec::new()),
            }
        }
        for run in runs.iter().filter(|run| !run.is_empty()) {
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="black" stroke-width="1.2"{dash} points="{}"/>"#,
                run.join(" ")
            );
        }
    }

    // Time axis under both panels.
    let tick_seconds = nice_ceiling(seconds / 10.0).max(1.0);
    let mut t = 0.0;
    while t <= seconds {
        let px = x((t * 1e9) as u64);
        for bottom in [RATE_BOTTOM, LATENCY_BOTTOM] {
            let _ = writeln!(
                svg,
                r##"<line x1="{px:.1}" y1="{bottom}" x2="{px:.1}" y2="{}" stroke="#444"/><text x="{px:.1}" y="{}" text-anchor="middle">{t:.0}s</text>"##,
                bottom + 4.0,
                bottom + 16.0
            );
        }
        t += tick_seconds;
    }
    draw_legend(&mut svg);
    svg.push_str("</svg>\n");
    svg
}

fn draw_faults(svg: &mut String, faults: &[FaultWindow], end_ns: u64, x: &dyn Fn(u64) -> f64) {
    for (index, fault) in faults.iter().enumerate() {
        let left = x(fault.start_ns);
        let right = x(fault.end_ns.min(end_ns)).max(left + 1.0);
        let color = fault_color(fault.kind);
        for (top, bottom) in [(RATE_TOP, RATE_BOTTOM), (LATENCY_TOP, LATENCY_BOTTOM)] {
            let _ = writeln!(
                svg,
                r#"<rect x="{left:.1}" y="{top}" width="{:.1}" height="{}" fill="{color}" fill-opacity="0.16"><title>{}</title></rect>"#,
                right - left,
                bottom - top,
                escape(&format!("{}: {}", fault.kind, fault.detail))
            );
        }
        // Labels alternate between two rows so neighbours do not overlap.
        let label_y = RATE_TOP - 4.0 - 11.0 * (index % 2) as f64;
        let _ = writeln!(
            svg,
            r#"<text x="{left:.1}" y="{label_y}" fill="{color}" font-size="10">{}</text>"#,
            fault.kind
        );
    }
}

/// A dotted line at each compaction's invocation, its revision and outcome in a tooltip.
fn draw_compactions(svg: &mut String, compactions: &[Compaction], x: &dyn Fn(u64) -> f64) {
    for compaction in compactions {
        let px = x(compaction.invoke);
        let outcome = match compaction.outcome {
            CompactOutcome::Ok => "ok",
            CompactOutcome::AlreadyCompacted => "already compacted",
            CompactOutcome::Failed => "failed",
            CompactOutcome::Unknown => "unknown",
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{px:.1}" y1="{RATE_TOP}" x2="{px:.1}" y2="{RATE_BOTTOM}" stroke="{COMPACTION_COLOR}"{COMPACTION_DASH}><title>compact {} =&gt; {outcome}</title></line>"#,
            compaction.revision
        );
    }
}

fn draw_frame(svg: &mut String, top: f64, bottom: f64, label: &str) {
    let right = WIDTH - MARGIN_RIGHT;
    let _ = writeln!(
        svg,
        r##"<rect x="{MARGIN_LEFT}" y="{top}" width="{}" height="{}" fill="none" stroke="#444"/><text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{label}</text>"##,
        right - MARGIN_LEFT,
        bottom - top,
        (top + bottom) / 2.0
    );
}

fn axis_label(svg: &mut String, y: f64, text: &str) {
    let _ = writeln!(
        svg,
        r##"<line x1="{}" y1="{y:.1}" x2="{MARGIN_LEFT}" y2="{y:.1}" stroke="#444"/><line x1="{MARGIN_LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{text}</text>"##,
        MARGIN_LEFT - 4.0,
        WIDTH - MARGIN_RIGHT,
        MARGIN_LEFT - 6.0,
        y + 4.0
    );
}

fn draw_legend(svg: &mut String) {
    let left = WIDTH - MARGIN_RIGHT + 14.0;
    let mut entries: Vec<(String, &str)> = Vec::new();
    for (color, text) in [
        (OK_COLOR, "ok"),
        (FAILED_COLOR, "failed"),
        (UNKNOWN_COLOR, "unknown (no answer)"),
    ] {
        let swatch = format!(r#"stroke="{color}" stroke-width="2""#);
        entries.push((swatch, text));
    }
    for (dash, text) in [
        ("", "p50 latency"),
        (r#" stroke-dasharray="4 2""#, "p99 latency"),
    ] {
        entries.push((format!(r#"stroke="black"{dash}"#), text));
    }
    entries.push((
        format!(r#"stroke="{COMPACTION_COLOR}"{COMPACTION_DASH}"#),
        "compaction",
    ));
    for (index, (style, text)) in entries.iter().enumerate() {
        let y = RATE_TOP + 6.0 + 17.0 * index as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{left}" y1="{y:.1}" x2="{}" y2="{y:.1}" {style}/><text x="{}" y="{:.1}">{text}</text>"#,
            left + 16.0,
            left + 22.0,
            y + 4.0
        );
    }
    for (index, kind) in FaultKind::ALL.into_iter().enumerate() {
        let y = RATE_TOP + 6.0 + 17.0 * (entries.len() + index) as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{left}" y="{:.1}" width="16" height="9" fill="{}" fill-opacity="0.35"/><text x="{}" y="{:.1}">{}</text>"#,
            y - 4.0,
            fault_color(kind),
            left + 22.0,
            y + 4.0,
            kind.name()
        );
    }
}

/// The smallest of 1, 2, 5 × 10^n at or above `value`.
fn nice_ceiling(value: f64) -> f64 {
    if value <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|step| step * magnitude)
        .find(|candidate| *candidate >= value)
        .unwrap_or(10.0 * magnitude)
}

fn format_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.0}s", ms / 1000.0)
    } else if ms >= 1.0 {
        format!("{ms:.0}")
    } else {
        format!("{ms}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{Answer, Call};

    fn op(id: u64, invoke_ms: u64, complete_ms: Option<u64>, result: Outcome) -> Op {
        Op {
            id,
            client: 0,
            call: Call::Get { key: b"k".to_vec() },
            invoke: invoke_ms * 1_000_000,
            complete: complete_ms.map(|ms| ms * 1_000_000),
            result,
        }
    }

    #[test]
    fn buckets_count_by_outcome_and_quantiles_pick_ranks() {
        let ok = || {
            Outcome::Ok(Answer::Get {
                revision: 1,
                kv: None,
            })
        };
        let history = vec![
            op(1, 100, Some(110), ok()),
            op(2, 200, Some(1_300), ok()),
            op(3, 300, Some(400), Outcome::Failed),
            op(4, 1_500, None, Outcome::Unknown),
        ];
        let buckets = buckets(&history, 2_000_000_000);
        assert_eq!(buckets.len(), 3);
        assert_eq!((buckets[0].ok, buckets[0].failed), (1, 1));
        assert_eq!((buckets[1].ok, buckets[1].unknown), (1, 1));
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), Some(2.0));
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.99), Some(4.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn renders_a_well_formed_picture() {
        let recorded = Recorded {
            history: vec![op(
                1,
                10,
                Some(20),
                Outcome::Ok(Answer::Put { revision: 2 }),
            )],
            watches: Vec::new(),
            faults: vec![FaultWindow {
                kind: FaultKind::Kill,
                detail: "kill -9 n1 <leader>".into(),
                start_ns: 5,
                end_ns: 500_000_000,
            }],
            end_ns: 3_000_000_000,
            op_members: Default::default(),
            watch_segments: Vec::new(),
            member_names: Vec::new(),
            compactions: vec![Compaction {
                id: 1,
                revision: 2,
                invoke: 1_000_000_000,
                complete: None,
                outcome: CompactOutcome::Unknown,
            }],
            ..Recorded::default()
        };
        let svg = render(&recorded, "a & b");
        assert!(svg.contains("compact 2 =&gt; unknown"));
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &amp; b"));
        assert!(svg.contains("&lt;leader&gt;"));
    }

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(120.0), 200.0);
        assert_eq!(nice_ceiling(1000.0), 1000.0);
    }
}
