//! `skerry-failover`: the cut-link failover measurement of issue 21, skerry beside etcd in one
//! run on one machine. For each target a fresh three-member cluster runs in network namespaces
//! (the torture harness's); each round cuts the leader's link to both peers with nft drop
//! rules, times the outage until a write is acknowledged through a survivor, checks that the
//! old leader steps down by itself while cut off (check-quorum), heals, and checks that it
//! rejoins as a follower and that no acknowledged write was lost. See
//! `skerry_tests::torture::failover`.
//!
//! ```text
//! cargo build --release -p skerry -p skerry-tests
//! target/release/skerry-failover --rounds 7
//! target/release/skerry-failover --target skerry --rounds 3 --out /tmp/failover
//! ```
//!
//! Both targets run with their default timeouts (`--heartbeat-interval`,
//! `--election-timeout`): what a user gets. Needs root (namespaces, nft). Prints each round
//! (outage, step-down and rejoin times, writes acknowledged and lost), each target's median
//! outage and the ratio skerry / etcd, and writes the same text to `failover-cut.txt` in the
//! output folder (`--out`, default `target/torture/failover-<unix seconds>`), beside the
//! members' logs. The SIGKILL and SIGSTOP cases are `skerry-loadgen`'s `failover` and
//! `failover-freeze` workloads. Exit code: 0 when every round of every target showed the
//! step-down, the rejoin and no lost write; 1 otherwise; 2 when it could not run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use skerry_tests::torture::Target;
use skerry_tests::torture::failover::{self, FailoverConfig, ROUNDS_DEFAULT};

#[derive(Parser)]
#[command(about = "Cut-link failover of a 3-member skerry and etcd cluster, side by side")]
struct Cli {
    /// Which targets to measure, in this order.
    #[arg(long, value_enum, default_value = "both")]
    target: TargetArg,
    /// Rounds per target.
    #[arg(long, default_value_t = ROUNDS_DEFAULT)]
    rounds: usize,
    /// The output folder [default: target/torture/failover-<unix seconds>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The skerry binary [default: next to this one, else target/release/skerry].
    #[arg(long)]
    skerry_bin: Option<PathBuf>,
    /// The etcd binary.
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd_bin: PathBuf,
}

#[derive(Clone, Copy, ValueEnum)]
enum TargetArg {
    Both,
    Skerry,
    Etcd,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("skerry-failover: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<bool> {
    let targets = match cli.target {
        TargetArg::Both => vec![Target::Skerry, Target::Etcd],
        TargetArg::Skerry => vec![Target::Skerry],
        TargetArg::Etcd => vec![Target::Etcd],
    };
    let out = match cli.out {
        Some(out) => out,
        None => default_out_dir()?,
    };
    let skerry_bin = match cli.skerry_bin {
        Some(bin) => bin,
        None => default_skerry_bin()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let mut runs = Vec::new();
    for target in targets {
        let config = FailoverConfig {
            target,
            bin: match target {
                Target::Skerry => skerry_bin.clone(),
                Target::Etcd => cli.etcd_bin.clone(),
            },
            rounds: cli.rounds,
            out_dir: out.join(target.to_string()),
        };
        let measured = runtime.block_on(async {
            tokio::select! {
                run = failover::measure(&config) => run,
                // Dropping the measurement drops its guards: members killed, namespaces removed.
                _ = tokio::signal::ctrl_c() => bail!("interrupted"),
            }
        })?;
        print!("{}", measured.text());
        runs.push(measured);
    }
    let text = failover::comparison_text(&runs);
    if runs.len() > 1 {
        print!(
            "{}",
            text.lines()
                .filter(|l| l.starts_with("median outage "))
                .map(|l| format!("{l}\n"))
                .collect::<String>()
        );
    }
    let report = out.join(failover::REPORT_FILE);
    std::fs::write(&report, &text).with_context(|| format!("write {}", report.display()))?;
    println!("report: {}", report.display());
    Ok(runs.iter().all(failover::FailoverRun::is_valid))
}

/// `skerry` next to this binary (a `cargo build` puts them side by side), else
/// `target/release/skerry`.
fn default_skerry_bin() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("find this binary")?;
    if let Some(dir) = exe.parent() {
        let sibling = dir.join("skerry");
        if sibling.exists() {
            return Ok(sibling);
        }
    }
    Ok(PathBuf::from("target/release/skerry"))
}

/// `<target dir>/torture/failover-<unix seconds>`, the target dir being the `target` this
/// binary was built in, else `./target`.
fn default_out_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("find this binary")?;
    let target_dir = exe
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|name| name == "target"))
        .map_or_else(|| Path::new("target").to_path_buf(), Path::to_path_buf);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("read the clock")?
        .as_secs();
    Ok(target_dir.join("torture").join(format!("failover-{now}")))
}
