//! Turns per-run results into one table (printed aligned, or as markdown) and a JSON document.
//!
//! Every number shown is a median over the runs that completed; with two targets the table
//! adds first/second ratios for throughput (above 1 is better for the first) and for p99
//! latency (below 1 is better for the first).

use serde_json::{Value, json};

use super::stats::{
    RunOutcome, SERVER_CPU_EXTRA, TargetSummary, median, paired_throughput_ratios, ratio,
};
use super::workloads::Workload;

/// One target's results: `outcomes[w][r]` is workload `w` of the report in run `r`.
pub struct TargetRuns {
    pub label: String,
    pub outcomes: Vec<Vec<RunOutcome>>,
}

/// Everything measured, ready to print.
pub struct Report {
    pub workloads: Vec<Workload>,
    pub targets: Vec<TargetRuns>,
}

impl Report {
    pub fn new(workloads: Vec<Workload>, labels: &[&str]) -> Self {
        let targets = labels
            .iter()
            .map(|label| TargetRuns {
                label: (*label).to_owned(),
                outcomes: workloads.iter().map(|_| Vec::new()).collect(),
            })
            .collect();
        Self { workloads, targets }
    }

    /// Records `outcome` as the next run of `workload` on target `target`.
    pub fn record(&mut self, target: usize, workload: Workload, outcome: RunOutcome) {
        let index = self.workload_index(workload);
        self.targets[target].outcomes[index].push(outcome);
    }

    fn workload_index(&self, workload: Workload) -> usize {
        self.workloads
            .iter()
            .position(|w| *w == workload)
            .expect("results are only recorded for the report's workloads")
    }

    /// Every failed run, one line each, for printing after the table.
    pub fn failures(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for target in &self.targets {
            for (workload, runs) in self.workloads.iter().zip(&target.outcomes) {
                for (run, outcome) in runs.iter().enumerate() {
                    if let Err(error) = outcome {
                        lines.push(format!(
                            "{} {} run {}: {error}",
                            target.label,
                            workload.name(),
                            run + 1
                        ));
                    }
                }
            }
        }
        lines
    }

    /// Error samples from runs that completed with server errors, one line each.
    pub fn error_samples(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for target in &self.targets {
            for (workload, runs) in self.workloads.iter().zip(&target.outcomes) {
                for (run, result) in runs.iter().enumerate() {
                    let Ok(result) = result else { continue };
                    if result.errors == 0 && result.stopped_early.is_none() {
                        continue;
                    }
                    lines.push(format!(
                        "{} {} run {}: {} errors{} e.g. {:?}",
                        target.label,
                        workload.name(),
                        run + 1,
                        result.errors,
                        result
                            .stopped_early
                            .as_ref()
                            .map(|s| format!(", {s}"))
                            .unwrap_or_default(),
                        result.error_samples
                    ));
                }
            }
        }
        lines
    }

    fn table(&self) -> Table {
        let pair = self.targets.len() == 2;
        let mut header = vec!["workload".to_owned(), "unit".to_owned()];
        let labels: Vec<&str> = self.targets.iter().map(|t| t.label.as_str()).collect();
        if self.targets.len() == 1 {
            header.extend(["throughput", "p50 ms", "p99 ms"].map(String::from));
        } else {
            header.extend(labels.iter().map(|l| (*l).to_owned()));
            if pair {
                header.push(format!("{}/{}", labels[0], labels[1]));
            }
            header.extend(labels.iter().map(|l| format!("{l} p50 ms")));
            header.extend(labels.iter().map(|l| format!("{l} p99 ms")));
            if pair {
                header.push("p99 ratio".to_owned());
            }
        }
        header.push("notes".to_owned());

        let mut rows = Vec::new();
        for (index, workload) in self.workloads.iter().enumerate() {
            let summaries: Vec<TargetSummary> = self
                .targets
                .iter()
                .map(|t| TargetSummary::from_runs(&t.outcomes[index]))
                .collect();
            let mut row = vec![workload.name().to_owned(), workload.unit().to_owned()];
            row.extend(summaries.iter().map(|s| format_throughput(s.throughput)));
            if pair {
                row.push(format_ratio(ratio(
                    summaries[0].throughput,
                    summaries[1].throughput,
                )));
            }
            row.extend(summaries.iter().map(|s| format_ms(s.p50_ms)));
            row.extend(summaries.iter().map(|s| format_ms(s.p99_ms)));
            if pair {
                row.push(format_ratio(ratio(
                    summaries[0].p99_ms,
                    summaries[1].p99_ms,
                )));
            }
            let mut notes: Vec<String> = summaries
                .iter()
                .zip(&self.targets)
                .filter_map(|(summary, target)| {
                    let runs = target.outcomes[index].len();
                    let notes = notes(summary, runs);
                    if notes.is_empty() {
                        None
                    } else if self.targets.len() == 1 {
                        Some(notes)
                    } else {
                        Some(format!("{}: {notes}", target.label))
                    }
                })
                .collect();
            if pair {
                let per_run = paired_throughput_ratios(
                    &self.targets[0].outcomes[index],
                    &self.targets[1].outcomes[index],
                );
                if per_run.len() > 1
                    && let (Some(low), Some(high), Some(mid)) = (
                        per_run.iter().copied().reduce(f64::min),
                        per_run.iter().copied().reduce(f64::max),
                        median(&per_run),
                    )
                {
                    notes.push(format!(
                        "{}/{} per run {}-{} (median {})",
                        labels[0],
                        labels[1],
                        format_ratio(Some(low)),
                        format_ratio(Some(high)),
                        format_ratio(Some(mid))
                    ));
                }
            }
            if pair && let Some(cpu_ratio) = server_cpu_ratio(&summaries[0], &summaries[1]) {
                notes.push(format!(
                    "server cpu {}/{} {}",
                    labels[0],
                    labels[1],
                    format_ratio(Some(cpu_ratio))
                ));
            }
            row.push(notes.join("; "));
            rows.push(row);
        }
        Table { header, rows }
    }

    /// The table aligned in columns for a terminal.
    pub fn text(&self) -> String {
        self.table().text()
    }

    /// The table in GitHub markdown, ready to paste into a README.
    pub fn markdown(&self) -> String {
        self.table().markdown()
    }

    /// Medians, ratios and every run's raw numbers, with `meta` describing the setup.
    pub fn json(&self, meta: Value) -> Value {
        let workloads: Vec<Value> = self
            .workloads
            .iter()
            .enumerate()
            .map(|(index, workload)| {
                let summaries: Vec<TargetSummary> = self
                    .targets
                    .iter()
                    .map(|t| TargetSummary::from_runs(&t.outcomes[index]))
                    .collect();
                let targets: serde_json::Map<String, Value> = self
                    .targets
                    .iter()
                    .zip(&summaries)
                    .map(|(target, summary)| {
                        (
                            target.label.clone(),
                            target_json(summary, &target.outcomes[index]),
                        )
                    })
                    .collect();
                let ratios = if summaries.len() == 2 {
                    json!({
                        "throughput": ratio(summaries[0].throughput, summaries[1].throughput),
                        "p99": ratio(summaries[0].p99_ms, summaries[1].p99_ms),
                        "server_cpu_us_per_op": server_cpu_ratio(&summaries[0], &summaries[1]),
                        "throughput_per_run": paired_throughput_ratios(
                            &self.targets[0].outcomes[index],
                            &self.targets[1].outcomes[index],
                        ),
                    })
                } else {
                    Value::Null
                };
                json!({
                    "workload": workload.name(),
                    "unit": workload.unit(),
                    "targets": targets,
                    "ratio": ratios,
                })
            })
            .collect();
        json!({ "meta": meta, "workloads": workloads })
    }
}

/// First/second ratio of the servers' median CPU time per operation; below 1 favours the first.
fn server_cpu_ratio(first: &TargetSummary, second: &TargetSummary) -> Option<f64> {
    ratio(
        first.extra(SERVER_CPU_EXTRA),
        second.extra(SERVER_CPU_EXTRA),
    )
}

fn target_json(summary: &TargetSummary, runs: &[RunOutcome]) -> Value {
    let extras: serde_json::Map<String, Value> = summary
        .extras
        .iter()
        .map(|e| (e.name.to_owned(), json!(e.value)))
        .collect();
    let runs: Vec<Value> = runs
        .iter()
        .map(|run| match run {
            Err(error) => json!({ "failed": error }),
            Ok(r) => json!({
                "ops": r.ops,
                "ops_planned": r.ops_planned,
                "errors": r.errors,
                "error_samples": r.error_samples,
                "stopped_early": r.stopped_early,
                "elapsed_s": r.elapsed.as_secs_f64(),
                "throughput": r.throughput(),
                "latency_samples": r.latency.count,
                "p50_ms": r.latency.p50_us as f64 / 1_000.0,
                "p99_ms": r.latency.p99_us as f64 / 1_000.0,
                "max_ms": r.latency.max_us as f64 / 1_000.0,
                "extras": r.extras.iter()
                    .map(|e| (e.name.to_owned(), json!(e.value)))
                    .collect::<serde_json::Map<String, Value>>(),
            }),
        })
        .collect();
    json!({
        "median": {
            "throughput": summary.throughput,
            "p50_ms": summary.p50_ms,
            "p99_ms": summary.p99_ms,
            "extras": extras,
        },
        "runs_ok": summary.runs_ok,
        "errors": summary.errors,
        "failures": summary.failures,
        "runs": runs,
    })
}

/// Extras, errors and failures of one target, or "" when there is nothing to say.
fn notes(summary: &TargetSummary, runs: usize) -> String {
    let mut notes: Vec<String> = summary
        .extras
        .iter()
        .map(|e| format!("{} {}{}", e.name, format_number(e.value), e.unit))
        .collect();
    if summary.errors > 0 {
        notes.push(format!("{} errors", summary.errors));
    }
    if summary.runs_stopped_early > 0 {
        notes.push(format!("{} runs stopped early", summary.runs_stopped_early));
    }
    if !summary.failures.is_empty() {
        notes.push(format!("FAILED {}/{runs} runs", summary.failures.len()));
    }
    notes.join(", ")
}

fn format_number(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn format_throughput(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), format_number)
}

fn format_ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn format_ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}x"))
}

/// Rows of cells; the first two columns and the last are text, the rest numbers.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn is_text_column(&self, column: usize) -> bool {
        column < 2 || column + 1 == self.header.len()
    }

    fn text(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                self.rows
                    .iter()
                    .chain(std::iter::once(&self.header))
                    .map(|row| row.get(c).map_or(0, |cell| cell.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |row: &Vec<String>| {
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(c, cell)| {
                    if self.is_text_column(c) {
                        format!("{cell:<width$}", width = widths[c])
                    } else {
                        format!("{cell:>width$}", width = widths[c])
                    }
                })
                .collect();
            cells.join("  ").trim_end().to_owned()
        };
        let mut out = line(&self.header);
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }

    fn markdown(&self) -> String {
        let line = |row: &Vec<String>| format!("| {} |", row.join(" | "));
        let rule: Vec<String> = (0..self.header.len())
            .map(|c| {
                if self.is_text_column(c) {
                    "---".to_owned()
                } else {
                    "---:".to_owned()
                }
            })
            .collect();
        let mut out = line(&self.header);
        out.push('\n');
        out.push_str(&line(&rule));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }
}
