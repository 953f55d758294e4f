//! `skerry-loadgen`: runs the same etcd v3 workloads against skerry and etcd and prints
//! throughput, p50/p99 latency and the skerry/etcd ratios side by side.
//!
//! It measures six workloads, each bounded in operations and in time:
//! - `put1`: 256-byte puts to distinct keys from one client, one request in flight.
//! - `put64`: the same puts from 64 concurrent clients over 8 gRPC connections.
//! - `get`: a linearizable Range of one existing key from 64 concurrent clients.
//! - `txn`: compare-and-swap Txns (mod_revision == last seen → put) from 64 clients on 16 hot
//!   keys; a failed compare counts as a txn and as a conflict.
//! - `watch`: 1,000 watchers on one key over 10 streams and one writer; delivered events/s,
//!   put-ack → event latency, and a check that every watcher saw every event in order. The
//!   writer puts 100 values/s, so events/s tops out near 100 × watchers: a server that keeps
//!   up scores that ceiling, and the latency columns tell servers apart.
//! - `range`: 20,000 keys under a prefix, scanned in pages of 500 at a pinned revision;
//!   pages/s and the time of a full scan.
//!
//! `compare` starts each server fresh (new temp data dir, free loopback ports, default
//! durability) for every run and target, alternates which goes first between runs, and
//! reports medians over the runs:
//!
//! ```text
//! cargo build -p skerry-tests --release --bin skerry-loadgen
//! target/release/skerry-loadgen compare --skerry-bin target/release/skerry \
//!     --etcd-bin /usr/bin/etcd --runs 3 --scale quick --markdown bench.md --json bench.json
//! ```
//!
//! `run` measures one existing endpoint (loopback only) once:
//!
//! ```text
//! target/release/skerry-loadgen run --endpoint http://127.0.0.1:2379 --workloads put1,get
//! ```
//!
//! Progress goes to stderr through `tracing` (`RUST_LOG=debug` for more); results go to
//! stdout. The exit code is 1 if any workload failed its checks or could not run.

#[path = "../loadgen/mod.rs"]
mod loadgen;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tokio::time::{Instant, timeout};
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use loadgen::failover::{Fault, failover_workload};
use loadgen::report::Report;
use loadgen::server::{Flavor, Server, ServerSpec};
use loadgen::workloads::{Plan, Scale, Workload, run_workload};

/// jemalloc, as the `skerry` binary uses. The load generator shares the two cores with the
/// servers it measures, so every microsecond it spends is taken from them: glibc's malloc
/// (`_int_malloc`, `_int_free`, `malloc_consolidate`) was ~10% of its CPU in a put64
/// profile, and that time was taken from skerry and etcd alike.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Upper bound on `--runs`: a full-scale run of everything takes minutes per target, so more
/// than this is a typo rather than a plan.
const RUNS_MAX: u32 = 20;

/// Bound on `etcd --version`, which answers instantly unless the binary is not etcd.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How to read the compare table, printed under it and in the markdown.
const COMPARE_FOOTNOTE: &str = "Throughput is in each row's unit. Ratios are skerry/etcd: a \
    throughput ratio above 1 and a p99 ratio below 1 favour skerry. Watch latency runs from \
    the put's ack to the event, 0 when the event arrives first.";

#[derive(Parser)]
#[command(
    name = "skerry-loadgen",
    about = "Runs etcd v3 workloads against skerry and etcd"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start skerry and etcd afresh for each run, run the workloads on both, compare medians.
    Compare(CompareArgs),
    /// Run the workloads once against an existing loopback endpoint.
    Run(RunArgs),
}

#[derive(Args)]
struct CompareArgs {
    /// The skerry binary, started as `skerry server --data-dir ... --listen-client-urls ...`.
    #[arg(long)]
    skerry_bin: PathBuf,
    /// The etcd binary.
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd_bin: PathBuf,
    /// Runs per target; medians are reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=RUNS_MAX as i64))]
    runs: u32,
    /// Members per target: 1 (a single server each) or 3 (a Raft cluster of three processes
    /// on loopback each; clients spread over the members).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=5))]
    members: u64,
    /// Self-test: start the skerry side with etcd's arguments, to compare etcd with itself.
    #[arg(long, hide = true)]
    skerry_as_etcd: bool,
    #[command(flatten)]
    selection: Selection,
    #[command(flatten)]
    output: Output,
}

#[derive(Args)]
struct RunArgs {
    /// The endpoint to measure, e.g. http://127.0.0.1:2379; loopback only. A cluster's members
    /// may be listed comma-separated: connections then go round-robin over them.
    #[arg(long)]
    endpoint: String,
    #[command(flatten)]
    selection: Selection,
    #[command(flatten)]
    output: Output,
}

#[derive(Args)]
struct Selection {
    /// Workloads to run, comma-separated, or `all`.
    #[arg(long, value_delimiter = ',', default_value = "all", value_parser = parse_workloads)]
    workloads: Vec<Vec<Workload>>,
    /// `quick` finishes a three-run compare in under three minutes; `full` has larger counts.
    #[arg(long, value_enum, default_value_t = Scale::Quick)]
    scale: Scale,
}

impl Selection {
    /// Whether every workload of `all` was asked for.
    fn all_requested(&self) -> bool {
        let chosen = self.workloads();
        Workload::ALL.iter().all(|w| chosen.contains(w))
    }

    /// The chosen workloads in the canonical order, each once.
    fn workloads(&self) -> Vec<Workload> {
        let mut chosen: Vec<Workload> = self.workloads.iter().flatten().copied().collect();
        chosen.sort();
        chosen.dedup();
        chosen
    }
}

#[derive(Args)]
struct Output {
    /// Also write medians, ratios and every run's numbers as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write the table as markdown, ready to paste into a README, here.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// One `--workloads` item: a workload's name, or `all`.
fn parse_workloads(item: &str) -> Result<Vec<Workload>, String> {
    if item.eq_ignore_ascii_case("all") {
        return Ok(Workload::ALL.to_vec());
    }
    Workload::from_str(item, true).map(|w| vec![w])
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Dropping the command's future on Ctrl-C drops every `Server`, which kills its process.
    let result = tokio::select! {
        result = run_command(cli.command) => result,
        signal = tokio::signal::ctrl_c() => {
            if let Err(e) = signal {
                error!("failed to listen for Ctrl-C: {e}");
                return ExitCode::from(2);
            }
            warn!("interrupted; killing servers");
            // 128 + SIGINT, as a shell reports a process killed by Ctrl-C.
            return ExitCode::from(130);
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            error!("failed to {e:#}");
            // 2, as clap uses for bad arguments, sets these apart from failed workloads (1).
            ExitCode::from(2)
        }
    }
}

async fn run_command(command: Command) -> Result<ExitCode> {
    match command {
        Command::Compare(args) => compare(args).await,
        Command::Run(args) => run_endpoint(args).await,
    }
}

async fn compare(args: CompareArgs) -> Result<ExitCode> {
    let plan = Plan::for_scale(args.selection.scale);
    let mut workloads = args.selection.workloads();
    if args.members >= 3
        && args.selection.all_requested()
        && !workloads.contains(&Workload::Failover)
    {
        // A cluster's `all` includes the failover measurements.
        workloads.push(Workload::Failover);
        workloads.push(Workload::FailoverFreeze);
    }
    for bin in [&args.skerry_bin, &args.etcd_bin] {
        std::fs::metadata(bin).with_context(|| format!("find server binary {}", bin.display()))?;
    }
    let specs = [
        ServerSpec {
            label: "skerry".into(),
            bin: args.skerry_bin.clone(),
            flavor: if args.skerry_as_etcd {
                Flavor::Etcd
            } else {
                Flavor::Skerry
            },
            members: args.members as usize,
        },
        ServerSpec {
            label: "etcd".into(),
            bin: args.etcd_bin.clone(),
            flavor: Flavor::Etcd,
            members: args.members as usize,
        },
    ];
    let etcd_version = etcd_version(&args.etcd_bin).await;
    let load_before = load_average();
    let mut report = Report::new(workloads.clone(), &["skerry", "etcd"]);
    let started = Instant::now();
    for run in 0..args.runs {
        // Alternate who goes first, so neither always gets the cooler page cache and disk.
        let order: [usize; 2] = if run % 2 == 0 { [0, 1] } else { [1, 0] };
        for target in order {
            info!(run = run + 1, runs = args.runs, target = %specs[target].label, "starting run");
            run_target(&specs[target], target, &workloads, &plan, &mut report).await;
        }
    }
    let elapsed = started.elapsed();
    let load_after = load_average();

    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let skerry_note = if args.skerry_as_etcd {
        " (self-test: etcd's arguments)"
    } else {
        ""
    };
    let intro = format!(
        "scale {scale}, {members} member(s) per target, median of {runs} runs, fresh server \
         and data dir per run; host: {cpus} \
         CPUs, load average {load_before} before and {load_after} after; skerry = \
         {skerry}{skerry_note}; etcd = {etcd} ({etcd_version})",
        scale = args.selection.scale.name(),
        members = args.members,
        runs = args.runs,
        skerry = args.skerry_bin.display(),
        etcd = args.etcd_bin.display(),
    );
    let meta = json!({
        "command": "compare",
        "scale": args.selection.scale.name(),
        "runs": args.runs,
        "members": args.members,
        "host_cpus": cpus,
        "skerry_bin": args.skerry_bin.display().to_string(),
        "skerry_as_etcd": args.skerry_as_etcd,
        "etcd_bin": args.etcd_bin.display().to_string(),
        "etcd_version": etcd_version,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "plan": plan.to_json(),
        "elapsed_s": elapsed.as_secs_f64(),
    });
    println!("skerry-loadgen compare: {intro}");
    println!("total time {:.0} s", elapsed.as_secs_f64());
    emit(&report, &intro, Some(COMPARE_FOOTNOTE), meta, &args.output)
}

/// Starts one target's server, runs every workload on it, and records each outcome; a server
/// that fails to start or dies fails the workloads it could not run.
async fn run_target(
    spec: &ServerSpec,
    target: usize,
    workloads: &[Workload],
    plan: &Plan,
    report: &mut Report,
) {
    let mut server = match Server::start(spec).await {
        Ok(server) => server,
        Err(e) => {
            error!(target = %spec.label, "failed to start server: {e:#}");
            for &workload in workloads {
                report.record(target, workload, Err(format!("start server: {e:#}")));
            }
            return;
        }
    };
    for &workload in workloads {
        let outcome = match server.check_alive() {
            Ok(()) if workload == Workload::Failover => {
                failover_workload(&mut server, plan.failover_kills, Fault::Kill).await
            }
            Ok(()) if workload == Workload::FailoverFreeze => {
                failover_workload(&mut server, plan.failover_kills, Fault::Freeze).await
            }
            Ok(()) => run_workload(workload, server.endpoint(), plan, &server.pids()).await,
            Err(e) => Err(e),
        };
        report.record(target, workload, outcome.map_err(|e| format!("{e:#}")));
    }
    if let Err(e) = server.check_alive() {
        warn!(target = %spec.label, "server died during the last workload: {e:#}");
    }
    if let Err(e) = server.stop().await {
        warn!(target = %spec.label, "failed to stop server: {e:#}");
    }
}

async fn run_endpoint(args: RunArgs) -> Result<ExitCode> {
    require_loopback(&args.endpoint)?;
    let plan = Plan::for_scale(args.selection.scale);
    let workloads = args.selection.workloads();
    let mut report = Report::new(workloads.clone(), &[args.endpoint.as_str()]);
    for &workload in &workloads {
        // No child process here, so no server CPU figure.
        let outcome = run_workload(workload, &args.endpoint, &plan, &[]).await;
        report.record(0, workload, outcome.map_err(|e| format!("{e:#}")));
    }
    let intro = format!(
        "scale {}, one run against {}",
        args.selection.scale.name(),
        args.endpoint
    );
    let meta = json!({
        "command": "run",
        "endpoint": args.endpoint,
        "scale": args.selection.scale.name(),
        "host_cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "plan": plan.to_json(),
    });
    println!("skerry-loadgen run: {intro}");
    emit(&report, &intro, None, meta, &args.output)
}

/// Prints the table and its failures, writes the optional files, and picks the exit code.
fn emit(
    report: &Report,
    intro: &str,
    footnote: Option<&str>,
    meta: Value,
    output: &Output,
) -> Result<ExitCode> {
    println!();
    print!("{}", report.text());
    let failures = report.failures();
    let error_samples = report.error_samples();
    if !error_samples.is_empty() {
        println!("\nserver errors:");
        for line in &error_samples {
            println!("  {line}");
        }
    }
    if let Some(footnote) = footnote {
        println!("\n{footnote}");
    }
    if !failures.is_empty() {
        println!("\nFAILED:");
        for line in &failures {
            println!("  {line}");
        }
    }
    if let Some(path) = &output.markdown {
        let mut markdown = format!("{intro}.\n\n{}", report.markdown());
        if let Some(footnote) = footnote {
            markdown.push('\n');
            markdown.push_str(footnote);
            markdown.push('\n');
        }
        write_file(path, &markdown)?;
    }
    if let Some(path) = &output.json {
        let text =
            serde_json::to_string_pretty(&report.json(meta)).context("encode JSON report")?;
        write_file(path, &text)?;
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("write {}", path.display()))?;
    info!(path = %path.display(), "wrote report");
    Ok(())
}

/// Refuses endpoints that are not plain-HTTP loopback: this tool writes thousands of keys and
/// must not be pointed at a shared cluster by accident.
fn require_loopback(endpoints: &str) -> Result<()> {
    endpoints.split(',').try_for_each(require_one_loopback)
}

fn require_one_loopback(endpoint: &str) -> Result<()> {
    let uri: tonic::codegen::http::Uri = endpoint
        .parse()
        .with_context(|| format!("parse endpoint {endpoint}"))?;
    if uri.scheme_str() != Some("http") {
        bail!("accept endpoint {endpoint}: only http:// is supported");
    }
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        bail!("accept endpoint {endpoint}: only loopback addresses are allowed");
    }
    Ok(())
}

/// The first line of `etcd --version`, or why it is unknown.
async fn etcd_version(bin: &Path) -> String {
    let output = tokio::process::Command::new(bin)
        .arg("--version")
        .kill_on_drop(true)
        .output();
    match timeout(VERSION_TIMEOUT, output).await {
        Ok(Ok(output)) => String::from_utf8_lossy(&output.stdout)
            .lines()
            .next()
            .unwrap_or("unknown version")
            .trim()
            .to_owned(),
        Ok(Err(e)) => format!("version unknown: {e}"),
        Err(_) => "version unknown: timed out".to_owned(),
    }
}

/// The host's 1, 5 and 15 minute load averages: anything else busy on the machine skews the
/// numbers, and a load near the CPU count before a compare says the results are suspect.
fn load_average() -> String {
    match std::fs::read_to_string("/proc/loadavg") {
        Ok(text) => text
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        Err(_) => "unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::require_loopback;

    #[test]
    fn loopback_endpoints_are_accepted_one_or_several() {
        for ok in [
            "http://127.0.0.1:2379",
            "http://localhost:2379",
            "http://[::1]:2379",
            "http://127.0.0.1:2379,http://127.0.0.1:22379,http://127.0.0.1:32379",
        ] {
            assert!(require_loopback(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn any_endpoint_off_loopback_or_not_plain_http_is_refused() {
        for (bad, why) in [
            ("http://10.0.0.1:2379", "only loopback"),
            ("https://127.0.0.1:2379", "only http://"),
            (
                "http://127.0.0.1:2379,http://10.0.0.1:2379",
                "only loopback",
            ),
            ("http://127.0.0.1:2379,", "parse endpoint"),
        ] {
            let err = require_loopback(bad).expect_err(bad).to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
