//! `skerry-apibench`: benchmarks skerry's apiserver in one process and prints a table (and,
//! with `--json`, a JSON summary).
//!
//! - Watch fan-out: one pod updated `--updates` times (default 100) while 1,000 and 10,000
//!   watchers watch it, measured (a) on the watch cache itself in process and (b) end to end
//!   over HTTP/2 + TLS to the real apiserver, watches multiplexed 200 to a connection;
//!   events delivered per second, delivery latency from just before the write call, and the
//!   cache's serialization count, which must equal the number of events (the run fails
//!   otherwise).
//! - LIST of 10,000 ~2 KiB pods from the watch cache (`resourceVersion=0`) and from the store
//!   (`resourceVersion=""`), in process and over HTTP, with the store/cache ratio.
//!
//! ```text
//! cargo run --release -p skerry-tests --bin skerry-apibench -- --json target/apibench.json
//! ```
//!
//! Progress goes to stderr (`RUST_LOG=debug` for more); the table to stdout. The exit code is
//! 1 if any check failed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use skerry_tests::apibench::{self, Options};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "skerry-apibench",
    about = "Benchmarks skerry's apiserver: watch fan-out and LIST"
)]
struct Cli {
    /// Watcher counts of the in-process fan-out, comma-separated (given with no value: skip).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1000,10000")]
    cache_watchers: Vec<usize>,
    /// Watcher counts of the HTTP/2 + TLS fan-out, comma-separated (given with no value: skip).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1000,10000")]
    http_watchers: Vec<usize>,
    /// Updates of the watched pod per fan-out run.
    #[arg(long, default_value_t = 100)]
    updates: usize,
    /// Least milliseconds between the starts of two updates (0: back to back, each write
    /// still awaiting the previous one's acknowledgement).
    #[arg(long, default_value_t = 0)]
    update_interval_ms: u64,
    /// Pods created for the LIST benchmark (0: skip it).
    #[arg(long, default_value_t = 10_000)]
    list_pods: usize,
    /// Runs of each scenario; the table shows medians.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Also write the JSON summary to this file (`-` for stdout, after the table).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("failed to benchmark the apiserver: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let options = Options {
        cache_watchers: cli.cache_watchers,
        http_watchers: cli.http_watchers,
        updates: cli.updates,
        update_interval: Duration::from_millis(cli.update_interval_ms),
        list_pods: cli.list_pods,
        runs: cli.runs,
    };
    options.validate()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let report = runtime.block_on(apibench::run(&options))?;
    print!("{}", report.table());
    if let Some(path) = cli.json {
        let json = serde_json::to_string_pretty(&report.to_json()).context("encode the JSON")?;
        if path.as_os_str() == "-" {
            println!("{json}");
        } else {
            std::fs::write(&path, json + "\n")
                .with_context(|| format!("write {}", path.display()))?;
        }
    }
    Ok(())
}
