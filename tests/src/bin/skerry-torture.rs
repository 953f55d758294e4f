//! `skerry-torture`: a Jepsen-style torture run against a real three-member cluster of skerry
//! (or etcd 3.4) processes: concurrent clients and watchers over the gRPC API, a nemesis
//! (partitions, kill -9, SIGSTOP, membership changes), then the checkers over the recorded
//! history. See `skerry_tests::torture`.
//!
//! ```text
//! cargo build --release -p skerry -p skerry-tests
//! target/release/skerry-torture --target skerry --duration 60s --nemesis all --clients 8
//! target/release/skerry-torture --target etcd --nemesis partition --out /tmp/etcd-run
//! ```
//!
//! As root each member gets a network namespace and partitions are nft rules; otherwise a TCP
//! proxy between members cuts them. A compactor compacts the store every `--compact-interval`
//! (default 5 s) during the run. The report folder (`--out`, default
//! `target/torture/<timestamp>`) holds `history.txt`, `watches.txt`, `compactions.txt`,
//! `faults.txt`, `verdict.txt`, `plot.svg` and the members' logs. Exit code: 0 when the run is valid, 1 when
//! it is not (a violation, an inconclusive check, a crash, no recovery), 2 when it could not
//! run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use skerry_tests::torture::nemesis::FaultKind;
use skerry_tests::torture::net::NetworkMode;
use skerry_tests::torture::{self, Config, Target};

#[derive(Parser)]
#[command(about = "Jepsen-style torture of a 3-member skerry or etcd cluster")]
struct Cli {
    /// What to torture.
    #[arg(long, value_enum, default_value = "skerry")]
    target: TargetArg,
    /// How long the clients run under the nemesis (e.g. 60s, 2m, 500ms).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Faults: partition, kill, pause, membership, or all; several joined by , or +.
    #[arg(long, default_value = "all")]
    nemesis: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Concurrent watchers.
    #[arg(long, default_value_t = 3)]
    watchers: usize,
    /// The report folder [default: target/torture/<timestamp>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The skerry binary [default: next to this one, else target/release/skerry].
    #[arg(long)]
    skerry_bin: Option<PathBuf>,
    /// The etcd binary.
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd_bin: PathBuf,
    /// netns (root only), proxy, or auto (netns as root).
    #[arg(long, value_enum, default_value = "auto")]
    network: NetworkArg,
    /// Seeds the clients' and the nemesis's choices [default: from the clock].
    #[arg(long)]
    seed: Option<u64>,
    /// How long an op may take before it is abandoned (a write's outcome is then unknown).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    op_timeout: Duration,
    /// Quiet time between faults (jittered ±50 %).
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    fault_interval: Duration,
    /// How long each fault lasts (jittered ±50 %).
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    fault_duration: Duration,
    /// Time the linearizability check may take before the run is called inconclusive.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    check_budget: Duration,
    /// --snapshot-count for every member.
    #[arg(long, default_value_t = 5_000)]
    snapshot_count: u64,
    /// How often the compactor compacts the store (jittered ±50 %); 0s turns it off
    /// [default: 5s, `torture::compactor::COMPACT_INTERVAL_DEFAULT`].
    #[arg(long, value_parser = parse_duration)]
    compact_interval: Option<Duration>,
}

#[derive(Clone, Copy, ValueEnum)]
enum TargetArg {
    Skerry,
    Etcd,
}

#[derive(Clone, Copy, ValueEnum)]
enum NetworkArg {
    Auto,
    Netns,
    Proxy,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("skerry-torture: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<bool> {
    let target = match cli.target {
        TargetArg::Skerry => Target::Skerry,
        TargetArg::Etcd => Target::Etcd,
    };
    let bin = match target {
        Target::Skerry => match cli.skerry_bin {
            Some(bin) => bin,
            None => default_skerry_bin()?,
        },
        Target::Etcd => cli.etcd_bin,
    };
    let out = match cli.out {
        Some(out) => out,
        None => default_out_dir(target)?,
    };
    let mut config = Config::new(target, bin, out);
    config.duration = cli.duration;
    config.nemeses = FaultKind::parse_list(&cli.nemesis)?;
    config.clients = cli.clients;
    config.watchers = cli.watchers;
    config.network = match cli.network {
        NetworkArg::Auto => NetworkMode::Auto,
        NetworkArg::Netns => NetworkMode::Namespaces,
        NetworkArg::Proxy => NetworkMode::Proxy,
    };
    config.seed = match cli.seed {
        Some(seed) => seed,
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    };
    config.op_timeout = cli.op_timeout;
    config.fault_interval = cli.fault_interval;
    config.fault_duration = cli.fault_duration;
    config.check_budget = cli.check_budget;
    config.snapshot_count = cli.snapshot_count;
    if let Some(interval) = cli.compact_interval {
        config.compact_interval = interval;
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let summary = runtime.block_on(async {
        tokio::select! {
            summary = torture::run(&config) => summary,
            // Dropping the run's future drops its guards: members killed, network removed.
            _ = tokio::signal::ctrl_c() => bail!("interrupted"),
        }
    })?;
    print!("{}", torture::report::verdict_text(&summary));
    println!("report: {}", config.out_dir.display());
    Ok(summary.is_valid())
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

/// `<target dir>/torture/<target>-<UTC timestamp>`, the target dir being the `target` this
/// binary was built in, else `./target`.
fn default_out_dir(target: Target) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("find this binary")?;
    let target_dir = exe
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|name| name == "target"))
        .map_or_else(|| Path::new("target").to_path_buf(), Path::to_path_buf);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("read the clock")?
        .as_secs();
    Ok(target_dir
        .join("torture")
        .join(format!("{target}-{}", utc_timestamp(now))))
}

/// `YYYYmmdd-HHMMSS` in UTC for `seconds` since the epoch (Howard Hinnant's days-to-civil).
fn utc_timestamp(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let time = seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        time / 3_600,
        time / 60 % 60,
        time % 60
    )
}

/// `500ms`, `30s`, `2m`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 30s or 2m"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{text:?}: unit must be ms, s or m")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_and_durations_parse() {
        assert_eq!(utc_timestamp(0), "19700101-000000");
        assert_eq!(utc_timestamp(951_782_400 + 3_661), "20000229-010101");
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("soon").is_err());
    }
}
