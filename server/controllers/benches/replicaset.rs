//! How long the ReplicaSet controller takes to create 1,000 pods against a real apiserver
//! (`TestServer`, in process): a ReplicaSet is scaled from 0 to 1,000 and the clock runs from
//! the scale write until the ReplicaSet's `status.replicas` says 1,000 — every pod created,
//! every creation observed through the watch, and the status written.
//!
//! Two client configurations for the controller (the bench's own client, which scales and
//! polls, is always unlimited):
//! - `unlimited`: QPS 0, what the apiserver and the controller can do;
//! - `kcm-default`: QPS 20 / burst 30, kube-controller-manager's `--kube-api-qps` /
//!   `--kube-api-burst` defaults — the figure a real cluster sees, bound by the rate limiter
//!   (1,000 creates at 20/s is ~50 s before any other cost).
//!
//! Each run uses a fresh server, so earlier runs' pods do not slow later ones. The median of
//! the runs is reported. `RS_BENCH_PODS` (default 1000), `RS_BENCH_RUNS` (default 3) and
//! `RS_BENCH_MODES` (default `unlimited,kcm-default`) adjust it.
//!
//! Run: `cargo bench -p skerry-controllers --bench replicaset`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Client, Patch, PatchParams, PostParams};
use skerry_controllers::context::Context;
use skerry_controllers::replicaset::{DEFAULT_WORKERS, ReplicaSetController};
use tokio_util::sync::CancellationToken;

/// kube-controller-manager's `--kube-api-qps` default.
const KCM_QPS: f64 = 20.0;
/// kube-controller-manager's `--kube-api-burst` default.
const KCM_BURST: u32 = 30;
/// A run that takes longer than this has failed (at 20 QPS, 1,000 pods take ~50 s).
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the bench reads the ReplicaSet's status: small against the total, large enough
/// not to load the apiserver.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

const NS: &str = "default";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn client_config(server: &TestServer, qps: f64, burst: u32) -> Config {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = qps;
    config.burst = burst;
    config
}

fn replica_set(name: &str) -> ReplicaSet {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(0),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            template: Some(PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "web".into(),
                        image: Some("nginx:1.27".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            }),
            min_ready_seconds: None,
        }),
        status: None,
    }
}

/// One run: a fresh server and controller; returns the time from the scale write to
/// `status.replicas == pods`.
async fn run_once(pods: i32, qps: f64, burst: u32) -> Result<Duration> {
    let server = TestServer::start().await?;
    let bench = Client::new(client_config(&server, 0.0, 1)).context("bench client")?;
    let controller_client =
        Client::new(client_config(&server, qps, burst)).context("controller client")?;
    let ctx = Context::new(controller_client);
    let controller = ReplicaSetController::new(&ctx);
    let stop = CancellationToken::new();
    ctx.informers.start(&stop);
    let running = tokio::spawn(controller.run(DEFAULT_WORKERS, stop.clone()));

    let api = bench.api::<ReplicaSet>(Some(NS));
    api.create(&PostParams::default(), &replica_set("bench"))
        .await
        .context("create the replicaset")?;
    // Wait for the controller to have synced the empty ReplicaSet once.
    let ready_deadline = Instant::now() + RUN_TIMEOUT;
    loop {
        let rs = api.get("bench").await?;
        if rs.status.and_then(|s| s.observed_generation).is_some() {
            break;
        }
        if Instant::now() > ready_deadline {
            bail!("the controller never synced the replicaset");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }

    let start = Instant::now();
    api.patch(
        "bench",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": pods}})),
    )
    .await
    .context("scale the replicaset")?;
    let elapsed = loop {
        let rs = api.get("bench").await?;
        if rs.status.is_some_and(|s| s.replicas == pods) {
            break start.elapsed();
        }
        if start.elapsed() > RUN_TIMEOUT {
            bail!("timed out after {RUN_TIMEOUT:?}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    };
    stop.cancel();
    let _ = running.await;
    Ok(elapsed)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let pods: i32 = env_or("RS_BENCH_PODS", 1000);
    let runs: usize = env_or::<usize>("RS_BENCH_RUNS", 3).max(1);
    let modes = std::env::var("RS_BENCH_MODES").unwrap_or_else(|_| "unlimited,kcm-default".into());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    for mode in modes.split(',').map(str::trim) {
        let (qps, burst) = match mode {
            "unlimited" => (0.0, 1),
            "kcm-default" => (KCM_QPS, KCM_BURST),
            other => bail!("unknown mode {other:?} (unlimited, kcm-default)"),
        };
        let mut times = Vec::with_capacity(runs);
        for run in 0..runs {
            let t = runtime.block_on(run_once(pods, qps, burst))?;
            println!(
                "replicaset/create-{pods}/{mode}: run {} {:.2} s ({:.0} pods/s)",
                run + 1,
                t.as_secs_f64(),
                f64::from(pods) / t.as_secs_f64()
            );
            times.push(t);
        }
        let m = median(times);
        println!(
            "replicaset/create-{pods}/{mode}: median of {runs} {:.2} s = {:.0} pods/s (qps {qps}, burst {burst})",
            m.as_secs_f64(),
            f64::from(pods) / m.as_secs_f64()
        );
    }
    Ok(())
}
