//! The failover measurements: in a running cluster, take the leader away (kill -9, or freeze
//! it with SIGSTOP so its connections stay open and silent, as a hung or unplugged box's do)
//! and time how long until a write succeeds on another member; bring it back, repeat.
//!
//! Measured the same way for skerry and etcd, with each one's default timeouts (heartbeat
//! 100 ms, election 1 s). A write attempt that gets no answer within [`ATTEMPT_TIMEOUT`] is
//! abandoned and retried on the next survivor, as a client with several endpoints would; so
//! the figure is what a client sees, not only the election.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use skerry_store::pb::etcdserverpb::{PutRequest, StatusRequest};
use tokio::time::{Instant, sleep, timeout};
use tracing::info;

use super::server::Server;
use super::stats::{LatencySummary, WorkloadResult};
use super::workloads::connect;

/// How long one write attempt may take before the client tries the next survivor: a few
/// healthy round trips; a request stuck on a dead leader is abandoned rather than waited for.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);
/// Longest outage accepted before the run is declared failed.
pub const OUTAGE_MAX: Duration = Duration::from_secs(30);
/// Quiet time after a restarted member is back, so the next kill starts from a settled cluster.
pub const SETTLE: Duration = Duration::from_millis(500);

/// The member every member names as leader, once they agree.
async fn leader(server: &Server, alive: &[bool]) -> Result<usize> {
    let deadline = Instant::now() + OUTAGE_MAX;
    let endpoints = server.endpoints();
    while Instant::now() < deadline {
        let mut leaders = Vec::new();
        let mut ids = Vec::new();
        for (i, endpoint) in endpoints.iter().enumerate() {
            if !alive[i] {
                continue;
            }
            let Ok(channel) = connect(endpoint, Some(ATTEMPT_TIMEOUT)).await else {
                continue;
            };
            if let Ok(status) = MaintenanceClient::new(channel)
                .status(StatusRequest::default())
                .await
            {
                let status = status.into_inner();
                leaders.push(status.leader);
                ids.push((i, status.header.map_or(0, |h| h.member_id)));
            }
        }
        if let Some(&first) = leaders.first()
            && first != 0
            && leaders.len() == alive.iter().filter(|a| **a).count()
            && leaders.iter().all(|l| *l == first)
            && let Some((i, _)) = ids.iter().find(|(_, id)| *id == first)
        {
            return Ok(*i);
        }
        sleep(Duration::from_millis(50)).await;
    }
    bail!("the members never agreed on a leader")
}

/// How the leader is taken away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL: the process dies and its kernel closes its connections at once.
    Kill,
    /// SIGSTOP: the process freezes with its connections open, as a hung box or a cut cable
    /// looks to its peers; it is thawed (SIGCONT) after the measurement.
    Freeze,
}

/// Takes the leader away `kills` times; each outage is one latency sample.
pub async fn failover_workload(
    server: &mut Server,
    kills: u64,
    fault: Fault,
) -> Result<WorkloadResult> {
    let members = server.endpoints().len();
    if members < 3 {
        bail!("failover needs a cluster: run compare with --members 3");
    }
    let mut samples = Vec::new();
    let mut total = Duration::ZERO;
    let mut errors = 0u64;
    let mut alive = vec![true; members];
    for kill in 0..kills {
        let victim = leader(server, &alive).await?;
        match fault {
            Fault::Kill => server.kill_member(victim).await?,
            Fault::Freeze => server.signal_member(victim, "STOP").await?,
        }
        alive[victim] = false;
        let started = Instant::now();
        let survivors: Vec<String> = server
            .endpoints()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| alive[*i])
            .map(|(_, e)| e)
            .collect();
        let mut attempt = 0usize;
        loop {
            if started.elapsed() > OUTAGE_MAX {
                bail!("no write succeeded within {OUTAGE_MAX:?} of the leader's death");
            }
            let endpoint = &survivors[attempt % survivors.len()];
            attempt += 1;
            let put = async {
                let channel = connect(endpoint, Some(ATTEMPT_TIMEOUT)).await?;
                KvClient::new(channel)
                    .put(PutRequest {
                        key: "loadgen/failover".into(),
                        value: kill.to_string().into(),
                        ..Default::default()
                    })
                    .await
                    .context("put")?;
                anyhow::Ok(())
            };
            match timeout(ATTEMPT_TIMEOUT, put).await {
                Ok(Ok(())) => break,
                _ => errors += 1,
            }
        }
        let outage = started.elapsed();
        info!(
            kill = kill + 1,
            outage_ms = outage.as_millis() as u64,
            "write resumed after the leader was taken away"
        );
        samples.push(outage.as_micros() as u64);
        total += outage;
        match fault {
            Fault::Kill => server.restart_member(victim).await?,
            Fault::Freeze => server.signal_member(victim, "CONT").await?,
        }
        alive[victim] = true;
        sleep(SETTLE).await;
    }
    Ok(WorkloadResult {
        ops: kills,
        ops_planned: kills,
        errors,
        error_samples: Vec::new(),
        stopped_early: None,
        elapsed: total,
        latency: LatencySummary::from_samples(samples),
        extras: Vec::new(),
    })
}
