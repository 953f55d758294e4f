//! `skerry-dnsbench`: cluster DNS's queries per second and latency from the cache (issue 20,
//! "DNS queries per second and p99 from the cache").
//!
//! One DNS server in process on loopback, as `run_server` builds it (the zone over Service
//! and EndpointSlice stores, the forwarder with its cache, hickory-server's UDP listener),
//! the stores filled by hand with `--services` ClusterIP Services, and an upstream of fixed
//! answers on loopback for the forwarded names. Two workloads, each `--runs` times for
//! `--seconds` with `--clients` concurrent clients (each one UDP socket, one question in
//! flight):
//! - cluster: `svc-<i>.bench.svc.cluster.local` A, answered from the informer caches;
//! - forwarded: `name-<i>.example` A, warmed first so every answer comes from the cache.
//!
//! Prints a Markdown table of the medians over the runs. Build with `--release` for figures.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use hickory_server::proto::op::{Message, Query, ResponseCode};
use hickory_server::proto::rr::{Name, RecordType};
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use skerry_client::cache::Indexer;
use skerry_net::dns::forward::{CACHE_CAPACITY, Forwarder};
use skerry_net::dns::metrics::Metrics;
use skerry_net::dns::server::{Handler, serve};
use skerry_net::dns::testing::Upstream;
use skerry_net::dns::zone::{self, Zone};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

/// A query's timeout: a lost UDP datagram on loopback is a failure of the run, not a wait.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// Distinct forwarded names (all cached after the warm-up).
const FORWARDED_NAMES: usize = 100;

#[derive(Parser, Debug)]
#[command(about = "cluster DNS: queries per second and latency from the cache")]
struct Args {
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Runs per workload (the table shows their medians).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// ClusterIP Services in the zone.
    #[arg(long, default_value_t = 1000)]
    services: usize,
}

struct RunResult {
    qps: f64,
    p50: Duration,
    p99: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn encode(name: &str) -> Result<Vec<u8>> {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name)?, RecordType::A));
    Ok(m.to_vec()?)
}

/// One client: asks `questions` round-robin until `deadline`; returns each latency.
async fn client(
    server: SocketAddr,
    questions: Arc<Vec<Vec<u8>>>,
    offset: usize,
    deadline: Instant,
) -> Result<Vec<Duration>> {
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    socket.connect(server).await?;
    let mut buf = vec![0u8; 4096];
    let mut latencies = Vec::new();
    let mut i = offset;
    let mut id: u16 = u16::try_from(offset % usize::from(u16::MAX)).unwrap_or(0);
    while Instant::now() < deadline {
        let mut q = questions[i % questions.len()].clone();
        id = id.wrapping_add(1);
        q[..2].copy_from_slice(&id.to_be_bytes());
        let start = Instant::now();
        socket.send(&q).await?;
        loop {
            let n = tokio::time::timeout(QUERY_TIMEOUT, socket.recv(&mut buf))
                .await
                .context("an answer within the timeout")??;
            let m = Message::from_vec(&buf[..n])?;
            if m.metadata.id != id {
                continue;
            }
            if m.metadata.response_code != ResponseCode::NoError || m.answers.is_empty() {
                bail!("unexpected answer {:?}", m.metadata.response_code);
            }
            break;
        }
        latencies.push(start.elapsed());
        i += 1;
    }
    Ok(latencies)
}

async fn run(
    server: SocketAddr,
    questions: &Arc<Vec<Vec<u8>>>,
    clients: usize,
    seconds: u64,
) -> Result<RunResult> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            tokio::spawn(client(
                server,
                questions.clone(),
                c * questions.len() / clients.max(1),
                deadline,
            ))
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    Ok(RunResult {
        qps: all.len() as f64 / elapsed,
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let services: Indexer<Service> = Indexer::new();
    for (n, f) in zone::service_indexes() {
        services.add_index(n, f).map_err(anyhow::Error::msg)?;
    }
    let slices: Indexer<EndpointSlice> = Indexer::new();
    for (n, f) in zone::slice_indexes() {
        slices.add_index(n, f).map_err(anyhow::Error::msg)?;
    }
    for i in 0..args.services {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 16, 0)) + i as u32);
        services.upsert(
            &format!("bench/svc-{i}"),
            Arc::new(Service {
                metadata: ObjectMeta {
                    name: Some(format!("svc-{i}")),
                    namespace: Some("bench".to_string()),
                    labels: Some(BTreeMap::new()),
                    ..ObjectMeta::default()
                },
                spec: Some(ServiceSpec {
                    cluster_ip: Some(ip.to_string()),
                    ..ServiceSpec::default()
                }),
                ..Service::default()
            }),
        );
    }
    let names: Vec<String> = (0..FORWARDED_NAMES)
        .map(|i| format!("name-{i}.example."))
        .collect();
    let upstream_names: Vec<(&str, Vec<Ipv4Addr>)> = names
        .iter()
        .map(|n| (n.as_str(), vec![Ipv4Addr::new(192, 0, 2, 1)]))
        .collect();
    let upstream = Upstream::start(&upstream_names).await?;
    let metrics = Arc::new(Metrics::new());
    let zone = Zone::new("cluster.local", None, services, slices).map_err(anyhow::Error::msg)?;
    let forwarder = Forwarder::new(vec![upstream.addr], CACHE_CAPACITY, metrics.clone());
    let stop = CancellationToken::new();
    let bound = serve(
        Handler::new(zone, forwarder, metrics.clone()),
        &["127.0.0.1:0".parse()?],
        stop.clone(),
    )
    .await?;
    let server = bound[0];

    let cluster: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..args.services.max(1))
            .map(|i| encode(&format!("svc-{i}.bench.svc.cluster.local.")))
            .collect::<Result<_>>()?,
    );
    let forwarded: Arc<Vec<Vec<u8>>> =
        Arc::new(names.iter().map(|n| encode(n)).collect::<Result<_>>()?);
    // Warm the cache: every forwarded name asked once.
    run(server, &forwarded, 1, 1).await?;
    let upstream_after_warmup = upstream.udp_queries();

    println!(
        "| workload | clients | services | queries/s | p50 | p99 |\n|---|---|---|---|---|---|"
    );
    for (label, questions) in [
        ("cluster names", &cluster),
        ("forwarded, cached", &forwarded),
    ] {
        let mut qps = Vec::new();
        let mut p50 = Vec::new();
        let mut p99 = Vec::new();
        for _ in 0..args.runs.max(1) {
            let r = run(server, questions, args.clients, args.seconds).await?;
            qps.push(r.qps);
            p50.push(r.p50.as_secs_f64() * 1e6);
            p99.push(r.p99.as_secs_f64() * 1e6);
        }
        println!(
            "| {label} | {} | {} | {:.0} | {:.0} µs | {:.0} µs |",
            args.clients,
            args.services,
            median(qps),
            median(p50),
            median(p99)
        );
    }
    let upstream_during = upstream.udp_queries() - upstream_after_warmup;
    println!(
        "\nupstream questions during the runs: {upstream_during} (0: every forwarded answer came from the cache); cache hits: {}",
        metrics.cache_hits("success")
    );
    stop.cancel();
    Ok(())
}
