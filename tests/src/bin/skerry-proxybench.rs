//! The service proxy benchmark (issue 20, "Measure"): the real syncer (`skerry_net::proxy`)
//! programming the real `nft` in a network namespace of its own, at 100, 1,000 and 10,000
//! Services of 5 endpoints each. Per size: the full sync (time to program, the script's
//! lines and bytes, rules and elements), and a one-Service partial sync (one Service's
//! endpoints changed: the time per changed Service). Several rounds, medians; a Markdown
//! table on stdout.
//!
//! Run as root with `nft` and `ip` installed:
//!
//! ```text
//! cargo build --release -p skerry-tests --bin skerry-proxybench
//! sudo target/release/skerry-proxybench
//! ```

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use skerry_net::proxy::{Family, Nft, RuleConfig, SyncReport, Syncer};

/// The NodePort range 30000-32767 (upstream's `--service-node-port-range` default): the
/// first this many Services are NodePorts, one port each, the rest ClusterIP only (NodePorts
/// are unique cluster-wide, the apiserver's allocator sees to it).
const NODE_PORT_BASE: usize = 30000;
/// See [`NODE_PORT_BASE`].
const NODE_PORTS: usize = 2768;

#[derive(Parser)]
#[command(about = "Full and one-Service partial syncs of the nftables service proxy")]
struct Args {
    /// Service counts to measure.
    #[arg(long, value_delimiter = ',', default_values_t = vec![100, 1000, 10000])]
    sizes: Vec<usize>,
    /// Full syncs per size.
    #[arg(long, default_value_t = 3)]
    full_rounds: usize,
    /// One-Service partial syncs per size.
    #[arg(long, default_value_t = 9)]
    partial_rounds: usize,
    /// Endpoints per Service (5, the issue's figure; 1 shows the Services that get no
    /// `numgen` map at all).
    #[arg(long, default_value_t = 5)]
    endpoints: usize,
}

/// The namespace, deleted on drop.
struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn service(i: usize) -> Result<Service> {
    // 10.96.0.0/16 holds 65,536 addresses: enough for any size measured.
    let ip = format!("10.96.{}.{}", (i >> 8) & 0xff, i & 0xff);
    let (kind, port) = if i < NODE_PORTS {
        (
            "NodePort",
            json!({"name": "http", "port": 80, "protocol": "TCP", "nodePort": NODE_PORT_BASE + i}),
        )
    } else {
        (
            "ClusterIP",
            json!({"name": "http", "port": 80, "protocol": "TCP"}),
        )
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"namespace": "bench", "name": format!("svc-{i}")},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": kind, "ports": [port]},
    }))?)
}

fn slice(i: usize, generation: usize, per: usize) -> Result<EndpointSlice> {
    let eps: Vec<_> = (0..per)
        .map(|e| {
            let n = i * per + e + generation;
            json!({"addresses": [format!("10.{}.{}.{}", 64 + ((n >> 16) & 0x3f), (n >> 8) & 0xff, n & 0xff)],
                   "conditions": {"ready": true}, "nodeName": "bench"})
        })
        .collect();
    Ok(serde_json::from_value(json!({
        "metadata": {"namespace": "bench", "name": format!("svc-{i}-x"),
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))?)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

struct Row {
    services: usize,
    full: Duration,
    full_nft: Duration,
    full_report: SyncReport,
    partial: Duration,
    partial_report: SyncReport,
}

fn measure(ns: &str, n: usize, args: &Args) -> Result<Row> {
    let nft = Nft::new(vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        ns.into(),
        "nft".into(),
    ]);
    // Each size starts from an empty namespace table.
    let _ = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "nft",
            "delete",
            "table",
            "ip",
            "skerry-proxy",
        ])
        .stderr(std::process::Stdio::null())
        .status();
    let cfg = RuleConfig {
        node_ips: vec!["192.168.99.2".parse()?],
        cluster_cidr: Some("10.64.0.0/10".into()),
        zone: None,
    };
    let mut syncer = Syncer::new(Family::V4, cfg, "bench".into(), nft);
    for i in 0..n {
        syncer.update_service(None, Some(&service(i)?));
        syncer.update_slice(
            &format!("bench/svc-{i}-x"),
            Some(&slice(i, 0, args.endpoints)?),
        );
    }
    let mut full_times = Vec::new();
    let mut full_nft = Vec::new();
    let mut full_report = SyncReport::default();
    for _ in 0..args.full_rounds {
        syncer.force_full();
        let t = Instant::now();
        let r = syncer.sync().context("full sync")?;
        full_times.push(t.elapsed());
        full_nft.push(r.nft_time);
        if !r.full {
            bail!("expected a full sync");
        }
        full_report = r;
    }
    let mut partial_times = Vec::new();
    let mut partial_report = SyncReport::default();
    for round in 0..args.partial_rounds {
        let i = (round * 7919) % n;
        syncer.update_slice(
            &format!("bench/svc-{i}-x"),
            Some(&slice(i, round + 1, args.endpoints)?),
        );
        let t = Instant::now();
        let r = syncer.sync().context("partial sync")?;
        partial_times.push(t.elapsed());
        if r.full {
            bail!("expected a partial sync");
        }
        partial_report = r;
    }
    Ok(Row {
        services: n,
        full: median(full_times),
        full_nft: median(full_nft),
        full_report,
        partial: median(partial_times),
        partial_report,
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    let ns = Ns(format!("pxbench{}", std::process::id()));
    let status = Command::new("ip").args(["netns", "add", &ns.0]).status()?;
    if !status.success() {
        bail!("ip netns add failed (root needed)");
    }
    let mut rows = Vec::new();
    for &n in &args.sizes {
        eprintln!("measuring {n} services");
        rows.push(measure(&ns.0, n, &args)?);
    }
    println!(
        "| Services | full sync (ms) | of which nft (ms) | script lines | script KiB | rules | elements | one-Service partial sync (ms) | its lines |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} |",
            r.services,
            ms(r.full),
            ms(r.full_nft),
            r.full_report.script_lines,
            r.full_report.script_bytes as f64 / 1024.0,
            r.full_report.rules,
            r.full_report.elements,
            ms(r.partial),
            r.partial_report.script_lines,
        );
    }
    Ok(())
}
