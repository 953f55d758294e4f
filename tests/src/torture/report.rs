//! The report folder of a run: `history.txt` (one op per line), `watches.txt` (every watch
//! log), `compactions.txt` (every compaction and read at a past revision), `faults.txt` (the
//! fault windows), `verdict.txt` (the checkers' `Report` and the run's figures) and
//! `plot.svg`. Plain text, so two runs compare with `diff` and a violation's op
//! ids can be found with `grep`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::nemesis::FaultKind;
use super::{Recorded, RunSummary, plot};
use crate::check::history::show;
use crate::check::{
    Answer, Call, CompactOutcome, Compaction, EventKind, Expect, Op, Outcome, PastRead,
    PastReadOutcome, WatchItem,
};

/// Writes every file of the report into `summary.config.out_dir`.
pub fn write(summary: &RunSummary) -> Result<()> {
    let dir = &summary.config.out_dir;
    let recorded = &summary.recorded;
    write_file(dir, "history.txt", &history_text(recorded))?;
    write_file(dir, "watches.txt", &watches_text(recorded))?;
    write_file(dir, "compactions.txt", &compactions_text(recorded))?;
    write_file(dir, "faults.txt", &faults_text(summary))?;
    write_file(dir, "verdict.txt", &verdict_text(summary))?;
    let title = format!(
        "{} under {} ({}): {}",
        summary.config.target,
        nemesis_names(&summary.config.nemeses),
        summary.network,
        first_line(&verdict_text(summary))
    );
    write_file(dir, "plot.svg", &plot::render(recorded, &title))
}

fn write_file(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

fn nemesis_names(kinds: &[FaultKind]) -> String {
    kinds
        .iter()
        .map(|kind| kind.name())
        .collect::<Vec<_>>()
        .join("+")
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

/// One op: `id client member invoke_ms complete_ms call => result`.
pub fn format_op(op: &Op, member: &str) -> String {
    let complete = op.complete.map_or_else(|| "-".to_owned(), ms);
    format!(
        "{:>7} c{:<3} {member:<3} {:>11} {:>11} {} => {}",
        op.id,
        op.client,
        ms(op.invoke),
        complete,
        format_call(&op.call),
        format_outcome(&op.result)
    )
}

fn format_call(call: &Call) -> String {
    match call {
        Call::Get { key } => format!("get {}", show(key)),
        Call::Put { key, value } => format!("put {} {}", show(key), show(value)),
        Call::Delete { key } => format!("delete {}", show(key)),
        Call::Cas { key, expect, value } => {
            let expect = match expect {
                Expect::ModRevision(revision) => format!("mod_revision={revision}"),
                Expect::Value(value) => format!("value={}", show(value)),
                Expect::Absent => "absent".to_owned(),
            };
            format!("cas {} if {expect} then put {}", show(key), show(value))
        }
        Call::Range { start, end } => format!("range [{}, {})", show(start), show(end)),
    }
}

fn format_outcome(outcome: &Outcome) -> String {
    let answer = match outcome {
        Outcome::Failed => return "failed".to_owned(),
        Outcome::Unknown => return "unknown".to_owned(),
        Outcome::Ok(answer) => answer,
    };
    match answer {
        Answer::Get { revision, kv } => match kv {
            Some(kv) => format!("ok rev={revision} {}@{}", show(&kv.value), kv.mod_revision),
            None => format!("ok rev={revision} absent"),
        },
        Answer::Put { revision } => format!("ok rev={revision}"),
        Answer::Delete { revision, deleted } => format!("ok rev={revision} deleted={deleted}"),
        Answer::Cas {
            revision,
            succeeded,
        } => {
            let branch = if *succeeded {
                "succeeded"
            } else {
                "compare failed"
            };
            format!("ok rev={revision} {branch}")
        }
        Answer::Range { revision, kvs } => {
            let kvs: Vec<String> = kvs
                .iter()
                .map(|kv| format!("{}={}@{}", show(&kv.key), show(&kv.value), kv.mod_revision))
                .collect();
            format!("ok rev={revision} [{}]", kvs.join(", "))
        }
    }
}

/// The name of member `index`, or `?`.
fn member_name(recorded: &Recorded, index: Option<usize>) -> &str {
    index
        .and_then(|index| recorded.member_names.get(index))
        .map_or("?", String::as_str)
}

fn history_text(recorded: &Recorded) -> String {
    let mut text = String::from(
        "# id client member invoke_ms complete_ms call => outcome (times in ms on the run's \
         monotonic clock)\n",
    );
    for op in &recorded.history {
        let member = member_name(recorded, recorded.op_members.get(&op.id).copied());
        text.push_str(&format_op(op, member));
        text.push('\n');
    }
    text
}

fn watches_text(recorded: &Recorded) -> String {
    let mut text = String::new();
    let no_segments = Vec::new();
    for (index, log) in recorded.watches.iter().enumerate() {
        let segments: &Vec<(usize, usize)> =
            recorded.watch_segments.get(index).unwrap_or(&no_segments);
        let _ = writeln!(
            text,
            "watcher {} range [{}, {}) from revision {} ({} items)",
            log.watcher,
            show(&log.range.0),
            show(&log.range.1),
            log.start_revision,
            log.items.len()
        );
        for (position, item) in log.items.iter().enumerate() {
            // A stream starts before its first item: name the member it was opened on.
            if let Some((_, member)) = segments.iter().find(|(first, _)| *first == position) {
                let _ = writeln!(
                    text,
                    "  (stream on {})",
                    member_name(recorded, Some(*member))
                );
            }
            let line = match item {
                WatchItem::Event {
                    revision,
                    key,
                    kind: EventKind::Put,
                    value,
                } => format!("put {} {} @{revision}", show(key), show(value)),
                WatchItem::Event {
                    revision,
                    key,
                    kind: EventKind::Delete,
                    ..
                } => format!("delete {} @{revision}", show(key)),
                WatchItem::Progress { revision } => format!("progress @{revision}"),
                WatchItem::Compacted {
                    compact_revision,
                    received,
                } => format!("compacted @{compact_revision} (at {} ms)", ms(*received)),
                WatchItem::Resumed { from_revision } => format!("resumed from {from_revision}"),
            };
            let _ = writeln!(text, "  {line}");
        }
    }
    text
}

/// One compaction: `id member invoke_ms complete_ms compact REVISION => outcome`.
pub fn format_compaction(compaction: &Compaction, member: &str) -> String {
    let complete = compaction.complete.map_or_else(|| "-".to_owned(), ms);
    let outcome = match compaction.outcome {
        CompactOutcome::Ok => "ok",
        CompactOutcome::AlreadyCompacted => "already compacted",
        CompactOutcome::Failed => "failed",
        CompactOutcome::Unknown => "unknown",
    };
    format!(
        "{:>5} {member:<3} {:>11} {:>11} compact {} => {outcome}",
        compaction.id,
        ms(compaction.invoke),
        complete,
        compaction.revision
    )
}

/// One past read: `id member invoke_ms complete_ms read RANGE at REVISION => outcome`.
pub fn format_past_read(read: &PastRead, member: &str) -> String {
    let outcome = match &read.outcome {
        PastReadOutcome::Ok {
            header_revision,
            kvs,
        } => format!("ok rev={header_revision} {} keys", kvs.len()),
        PastReadOutcome::Compacted => "compacted".to_owned(),
        PastReadOutcome::Failed => "failed".to_owned(),
    };
    format!(
        "{:>5} {member:<3} {:>11} {:>11} read [{}, {}) at {} => {outcome}",
        read.id,
        ms(read.invoke),
        ms(read.complete),
        show(&read.range.0),
        show(&read.range.1),
        read.revision
    )
}

fn compactions_text(recorded: &Recorded) -> String {
    let mut text = String::from(
        "# compactions: id member invoke_ms complete_ms request => outcome (physical=false)\n",
    );
    for (index, compaction) in recorded.compactions.iter().enumerate() {
        let member = member_name(recorded, recorded.compaction_members.get(index).copied());
        let _ = writeln!(text, "{}", format_compaction(compaction, member));
    }
    text.push_str(
        "# reads at past revisions: id member invoke_ms complete_ms request => outcome\n",
    );
    for (index, read) in recorded.past_reads.iter().enumerate() {
        let member = member_name(recorded, recorded.past_read_members.get(index).copied());
        let _ = writeln!(text, "{}", format_past_read(read, member));
    }
    text
}

fn faults_text(summary: &RunSummary) -> String {
    let mut text = String::from("# start_s end_s kind detail\n");
    for fault in &summary.recorded.faults {
        let _ = writeln!(
            text,
            "{:>9.3} {:>9.3} {:<10} {}",
            fault.start_ns as f64 / 1e9,
            fault.end_ns as f64 / 1e9,
            fault.kind.name(),
            fault.detail
        );
    }
    if let Some(error) = &summary.nemesis_error {
        let _ = writeln!(text, "# nemesis error: {error}");
    }
    for crash in &summary.crashes {
        let _ = writeln!(text, "# crash: {crash}");
    }
    text
}

/// Counts of one kind of call by how it ended.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    ok: u64,
    failed: u64,
    unknown: u64,
}

/// `verdict.txt`: the overall verdict on the first line, then the checkers' report, the
/// checks the run adds (replicas, crashes, the nemesis), and the run's figures.
pub fn verdict_text(summary: &RunSummary) -> String {
    let mut text = String::new();
    let overall = if summary.is_valid() {
        "VALID"
    } else if summary
        .report
        .as_ref()
        .is_some_and(|report| report.has_violation())
        || summary
            .observed
            .as_ref()
            .is_ok_and(|observed| observed.replicas.is_err())
    {
        "INVALID"
    } else {
        "NOT VALID"
    };
    let _ = writeln!(text, "{overall}");
    let _ = writeln!(text);
    match (&summary.report, &summary.observed) {
        (Some(report), _) => {
            let _ = write!(text, "checkers: {report}");
        }
        (None, Err(reason)) => {
            let _ = writeln!(text, "not checked: {reason}");
        }
        (None, Ok(_)) => {
            let _ = writeln!(text, "not checked");
        }
    }
    if let Ok(observed) = &summary.observed {
        match &observed.replicas {
            Ok(compared) => {
                let compared: Vec<String> = compared
                    .iter()
                    .map(|(name, revisions)| format!("{name} on {revisions}"))
                    .collect();
                let _ = writeln!(
                    text,
                    "replicas: ok (every member's committed history agrees; revisions compared: \
                     {} of {})",
                    compared.join(", "),
                    observed.final_revision
                );
            }
            Err(difference) => {
                let _ = writeln!(text, "replicas: {difference}");
            }
        }
    }
    if summary.crashes.is_empty() {
        let _ = writeln!(text, "crashes: none");
    } else {
        for crash in &summary.crashes {
            let _ = writeln!(text, "crash: {crash}");
        }
    }
    match &summary.nemesis_error {
        Some(error) => {
            let _ = writeln!(text, "nemesis: failed: {error}");
        }
        None => {
            let _ = writeln!(text, "nemesis: ok");
        }
    }

    let config = &summary.config;
    let recorded = &summary.recorded;
    let _ = writeln!(text);
    let _ = writeln!(
        text,
        "target: {} ({})\nnetwork: {}\nnemesis: {}\nseed: {}\nduration: {:.1}s under faults, \
         {:.1}s in all\nclients: {}, watchers: {}, op timeout: {:?}\nkeys: {} per generation, \
         a new generation every {:?}\nsnapshot count: {}\ncompact interval: {:?} (keeping {} \
         revisions)",
        config.target,
        config.bin.display(),
        summary.network,
        nemesis_names(&config.nemeses),
        config.seed,
        config.duration.as_secs_f64(),
        recorded.end_ns as f64 / 1e9,
        config.clients,
        config.watchers,
        config.op_timeout,
        config.keys.keys_per_generation,
        config.keys.generation_period,
        config.snapshot_count,
        config.compact_interval,
        super::compactor::COMPACT_KEEP_REVISIONS
    );

    let mut by_kind: BTreeMap<&str, Counts> = BTreeMap::new();
    let mut cas_succeeded = 0u64;
    let mut latencies_ms: Vec<f64> = Vec::new();
    for op in &recorded.history {
        let name = match op.call {
            Call::Get { .. } => "get",
            Call::Put { .. } => "put",
            Call::Delete { .. } => "delete",
            Call::Cas { .. } => "cas",
            Call::Range { .. } => "range",
        };
        let counts = by_kind.entry(name).or_default();
        match &op.result {
            Outcome::Ok(answer) => {
                counts.ok += 1;
                if matches!(
                    answer,
                    Answer::Cas {
                        succeeded: true,
                        ..
                    }
                ) {
                    cas_succeeded += 1;
                }
                if let Some(complete) = op.complete {
                    latencies_ms.push(complete.saturating_sub(op.invoke) as f64 / 1e6);
                }
            }
            Outcome::Failed => counts.failed += 1,
            Outcome::Unknown => counts.unknown += 1,
        }
    }
    let total = by_kind.values().fold(Counts::default(), |sum, c| Counts {
        ok: sum.ok + c.ok,
        failed: sum.failed + c.failed,
        unknown: sum.unknown + c.unknown,
    });
    let seconds = (recorded.end_ns as f64 / 1e9).max(1e-9);
    let _ = writeln!(
        text,
        "\nops: {} ({:.0} ok/s): {} ok, {} failed, {} unknown",
        recorded.history.len(),
        total.ok as f64 / seconds,
        total.ok,
        total.failed,
        total.unknown
    );
    for (name, counts) in &by_kind {
        let _ = writeln!(
            text,
            "  {name:<7} {:>7} ok {:>6} failed {:>6} unknown",
            counts.ok, counts.failed, counts.unknown
        );
    }
    let _ = writeln!(text, "  cas that succeeded: {cas_succeeded}");
    latencies_ms.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        let rank = ((latencies_ms.len() as f64 * q).ceil() as usize).clamp(1, latencies_ms.len());
        latencies_ms[rank - 1]
    };
    if !latencies_ms.is_empty() {
        let _ = writeln!(
            text,
            "latency of ok ops: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            pick(0.5),
            pick(0.99),
            pick(1.0)
        );
    }

    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    for fault in &recorded.faults {
        *faults.entry(fault.kind.name()).or_default() += 1;
    }
    let faults: Vec<String> = faults.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let _ = writeln!(
        text,
        "faults: {} ({})",
        recorded.faults.len(),
        faults.join(", ")
    );

    let (mut events, mut progress, mut resumes) = (0usize, 0usize, 0usize);
    for item in recorded.watches.iter().flat_map(|log| &log.items) {
        match item {
            WatchItem::Event { .. } => events += 1,
            WatchItem::Progress { .. } => progress += 1,
            WatchItem::Resumed { .. } => resumes += 1,
            WatchItem::Compacted { .. } => {}
        }
    }
    let _ = writeln!(
        text,
        "watches: {} watchers, {events} events, {progress} progress notifications, {resumes} \
         resumes, {} cut off by compaction",
        recorded.watches.len(),
        recorded.watchers_compacted()
    );
    let mut compactions: BTreeMap<&str, usize> = BTreeMap::new();
    for compaction in &recorded.compactions {
        let outcome = match compaction.outcome {
            CompactOutcome::Ok => "ok",
            CompactOutcome::AlreadyCompacted => "already compacted",
            CompactOutcome::Failed => "failed",
            CompactOutcome::Unknown => "unknown",
        };
        *compactions.entry(outcome).or_default() += 1;
    }
    let compactions: Vec<String> = compactions
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
    let floor = recorded
        .compactions
        .iter()
        .filter(|compaction| compaction.outcome == CompactOutcome::Ok)
        .map(|compaction| compaction.revision)
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        text,
        "compactions: {} ({}), highest acknowledged at {floor}",
        recorded.compactions.len(),
        compactions.join(", ")
    );
    let (mut read_ok, mut read_compacted, mut read_failed) = (0usize, 0usize, 0usize);
    for read in &recorded.past_reads {
        match read.outcome {
            PastReadOutcome::Ok { .. } => read_ok += 1,
            PastReadOutcome::Compacted => read_compacted += 1,
            PastReadOutcome::Failed => read_failed += 1,
        }
    }
    let _ = writeln!(
        text,
        "past reads: {} ({read_ok} ok, {read_compacted} compacted, {read_failed} failed)",
        recorded.past_reads.len()
    );
    let readers: Vec<String> = recorded
        .readers
        .iter()
        .map(|reader| {
            format!(
                "{} {} resumes, {} cut off ({} revisions lost)",
                reader.name, reader.resumes, reader.holes, reader.revisions_lost
            )
        })
        .collect();
    let _ = writeln!(text, "history readers: {}", readers.join("; "));
    if let Ok(observed) = &summary.observed {
        let _ = writeln!(
            text,
            "final revision: {}, keys present: {}, committed events: {} (from revision {})",
            observed.final_revision,
            observed.final_state.len(),
            observed.committed.events.len(),
            observed.committed.from_revision
        );
    }
    let _ = writeln!(text, "check time: {:.2}s", summary.check_time.as_secs_f64());
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{KeyValue, Versioned};

    #[test]
    fn ops_print_on_one_line() {
        let op = Op {
            id: 7,
            client: 2,
            call: Call::Cas {
                key: b"k".to_vec(),
                expect: Expect::ModRevision(5),
                value: b"c2-9".to_vec(),
            },
            invoke: 1_500_000,
            complete: None,
            result: Outcome::Unknown,
        };
        assert_eq!(
            format_op(&op, "n1"),
            "      7 c2   n1        1.500           - cas k if mod_revision=5 then put c2-9 => \
             unknown"
        );
        let get = Outcome::Ok(Answer::Get {
            revision: 9,
            kv: Some(Versioned {
                value: b"v\n".to_vec(),
                mod_revision: 4,
            }),
        });
        assert_eq!(format_outcome(&get), "ok rev=9 v\\n@4");
        let range = Outcome::Ok(Answer::Range {
            revision: 9,
            kvs: vec![KeyValue {
                key: b"a".to_vec(),
                value: b"1".to_vec(),
                mod_revision: 3,
            }],
        });
        assert_eq!(format_outcome(&range), "ok rev=9 [a=1@3]");
    }
}
