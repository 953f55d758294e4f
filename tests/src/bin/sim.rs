//! The long run of the deterministic simulation: `sim --seeds 100000` runs seeds from
//! `--first` on every core and prints each failing seed (replay it with
//! `SKERRY_SIM_SEED=<seed> cargo test -p skerry-tests --test sim`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use clap::Parser;
use skerry_tests::sim::{SimConfig, run_seed};

#[derive(Parser)]
#[command(about = "Run the deterministic simulation over many seeds")]
struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 10_000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1_000_000)]
    first: u64,
    /// Members per cluster (3 or 5); 0 alternates as CI does (every fifth seed 5).
    #[arg(long, default_value_t = 0)]
    members: usize,
    /// Client operations per seed.
    #[arg(long, default_value_t = 120)]
    ops: usize,
    /// Print every seed's summary, not only failures.
    #[arg(long)]
    verbose: bool,
}

fn main() {
    let args = Args::parse();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = Arc::new(AtomicU64::new(args.first));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicU64::new(0));
    // Ops, crashes, partitions, snapshots sent, members replaced, over every seed.
    let totals = Arc::new(Mutex::new([0u64; 5]));
    let started = std::time::Instant::now();
    let end = args.first + args.seeds;
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (next, failed, done) = (next.clone(), failed.clone(), done.clone());
            let totals = totals.clone();
            let (members, ops, verbose) = (args.members, args.ops, args.verbose);
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        return;
                    }
                    let config = SimConfig {
                        members: match members {
                            0 if seed.is_multiple_of(5) => 5,
                            0 => 3,
                            n => n,
                        },
                        ops,
                        ..SimConfig::default()
                    };
                    match run_seed(seed, &config) {
                        Ok(outcome) => {
                            let s = &outcome.run.stats;
                            if let Ok(mut t) = totals.lock() {
                                t[0] += outcome.run.history.len() as u64;
                                t[1] += s.crashes;
                                t[2] += s.partitions;
                                t[3] += s.snapshots_installed;
                                t[4] += s.members_replaced;
                            }
                            if verbose || !outcome.is_valid() {
                                println!("{}", outcome.summary());
                            }
                            if !outcome.is_valid()
                                && let Ok(mut f) = failed.lock()
                            {
                                f.push(seed);
                            }
                        }
                        Err(e) => {
                            println!("seed {seed}: could not run: {e}");
                            if let Ok(mut f) = failed.lock() {
                                f.push(seed);
                            }
                        }
                    }
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if n.is_multiple_of(1_000) {
                        eprintln!("{n} seeds in {:.0?}", started.elapsed());
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let failed = failed.lock().map(|f| f.clone()).unwrap_or_default();
    let t = totals.lock().map(|t| *t).unwrap_or_default();
    println!(
        "{} ops, {} crashes, {} partitions, {} snapshots sent, {} members replaced",
        t[0], t[1], t[2], t[3], t[4]
    );
    println!(
        "{} seeds ({}..{}) in {:.1?}: {} failed {:?}",
        args.seeds,
        args.first,
        end,
        started.elapsed(),
        failed.len(),
        failed
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}
