//! The cut-link failover measurement (issue 21): in a real three-member cluster (skerry, or
//! etcd for comparison) whose members each live in a network namespace, cut the leader's link
//! to both peers with nft drop rules and time how long until a write is acknowledged again
//! through a survivor; then check that the old leader steps down by itself while still cut off
//! (check-quorum), that after the heal it rejoins as a follower, and that no acknowledged write
//! was lost.
//!
//! It reuses the torture harness: `net` for the namespaces and the nft rules (a [`Partition`]
//! blocking every pair between the leader and the others, both directions), `cluster` for the
//! member processes with etcd's flags and defaults, and `lock` for one run at a time. Clients
//! live in the root namespace and are never cut, so the measuring client can still ask the cut
//! leader for its Status; but it writes only through the survivors.
//!
//! A round, [`FailoverConfig::rounds`] times:
//! 1. wait until the three members agree on a leader and answer reads; one write through it;
//! 2. cut the leader off; from that instant, write through the survivors as a client with
//!    several endpoints would (the loadgen's `failover` policy): an attempt unanswered within
//!    [`ATTEMPT_TIMEOUT`] is abandoned and the next survivor is tried. The outage is the time
//!    to the first acknowledged write. Meanwhile the old leader's Status is polled until it
//!    names a leader other than itself (or none): the step-down;
//! 3. a few more writes through the new leader while the old one is still cut off, so it has
//!    something to catch up on;
//! 4. heal; wait until all three name the same leader, not the old one, and the old leader
//!    answers a linearizable read: the rejoin;
//! 5. a linearizable Range of the round's keys through the leader and through the old leader
//!    must hold every acknowledged write with its value.
//!
//! The trick it carries: the measuring client's path to the cut member is not the peers' path
//! (the bridge's address is never in a drop rule), so the step-down is observed from outside
//! while the member is still isolated from its peers, as check-quorum promises.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::{PutRequest, RangeRequest, StatusResponse};
use tokio::time::{Instant, sleep, timeout};
use tonic::transport::Channel;
use tracing::{info, warn};

use super::client::{lazy_channel, prefix_end};
use super::cluster::Cluster;
use super::lock::RunLock;
use super::net::{BlockMode, Network, NetworkMode, Partition};
use super::{Clock, Config, MEMBERS, Target};

/// Rounds of the measurement by default: an odd number, so the median is one round's figure;
/// seven is the loadgen's `failover` default and keeps a run of both targets near two minutes.
pub const ROUNDS_DEFAULT: usize = 7;

/// How long one write attempt may take before the client tries the next survivor: the
/// loadgen's `failover::ATTEMPT_TIMEOUT` (a few healthy round trips), so the cut-link figure
/// compares with the SIGKILL and SIGSTOP ones.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);

/// Longest outage accepted before the round is declared failed (the loadgen's `OUTAGE_MAX`).
const OUTAGE_MAX: Duration = Duration::from_secs(30);

/// How long the cut-off leader gets to step down, counted from the cut. Both targets step
/// down after one election timeout without hearing from a quorum (etcd's `--election-timeout`
/// default, 1 s; raft's `checkQuorum`); ten times that is a failure, not slowness.
const STEP_DOWN_MAX: Duration = Duration::from_secs(10);

/// How long a healed cluster gets to agree on a leader with the old one as a follower and
/// caught up (the torture's recovery bound is 60 s for harder cases; a rejoin after a short
/// cut takes about a heartbeat plus the catch-up).
const REJOIN_MAX: Duration = Duration::from_secs(30);

/// How long the members get to agree on a leader at the start of a round.
const LEADER_MAX: Duration = Duration::from_secs(30);

/// Pause between two Status polls: the resolution of the step-down and rejoin times, small
/// against the election timeout (1 s).
const STATUS_POLL: Duration = Duration::from_millis(20);

/// Bound on one Status call, read, or write outside the outage made by this module (the
/// cluster's own `ADMIN_CALL_TIMEOUT`): a debug build on a busy machine can take longer than
/// [`ATTEMPT_TIMEOUT`] for a healthy write; a Status poll that takes longer is polled again.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes through the new leader after the first acknowledged one, while the old leader is
/// still cut off: entries it must catch up on when it rejoins.
const WRITES_AFTER_OUTAGE: usize = 5;

/// Quiet time between rounds (the loadgen's `failover::SETTLE`), so a round starts from a
/// settled cluster.
const SETTLE: Duration = Duration::from_millis(500);

/// Where every key of a run lives; a round's keys are under `<KEY_PREFIX><round>/`.
const KEY_PREFIX: &str = "failover-cut/";

/// The report file's name in the output folder.
pub const REPORT_FILE: &str = "failover-cut.txt";

/// One measurement's settings.
#[derive(Debug, Clone)]
pub struct FailoverConfig {
    pub target: Target,
    /// The `skerry` or `etcd` binary.
    pub bin: PathBuf,
    pub rounds: usize,
    /// Where the members' logs go (`logs/`).
    pub out_dir: PathBuf,
}

/// What one round saw; times are from the cut unless said otherwise.
#[derive(Debug, Clone)]
pub struct Round {
    /// Member names: the leader that was cut off, and the one that acknowledged the first
    /// write after the cut (a survivor's view of the leader once a write went through).
    pub old_leader: String,
    pub new_leader: String,
    /// From the cut to the first acknowledged write through a survivor.
    pub outage: Duration,
    /// When both survivors first named the same leader other than the cut one, polled every
    /// [`STATUS_POLL`]: the election alone, free of the client's retry timing (the outage
    /// comes in steps of [`ATTEMPT_TIMEOUT`] when attempts stuck on the old leader are
    /// abandoned). `None`: not seen within [`OUTAGE_MAX`].
    pub elected: Option<Duration>,
    /// Write attempts abandoned or refused before that one.
    pub failed_attempts: u64,
    /// When the old leader, still cut off, stopped naming itself leader (`None`: not within
    /// [`STEP_DOWN_MAX`]), and whom it named then (0: nobody).
    pub step_down: Option<Duration>,
    pub leader_named_after_step_down: u64,
    /// From the heal until all three agreed on a leader other than the old one and the old
    /// one answered a linearizable read (`None`: not within [`REJOIN_MAX`]).
    pub rejoin: Option<Duration>,
    /// The leader after the rejoin, and whether it is `new_leader` (a rejoining member that
    /// forced an election would change it).
    pub leader_after_heal: Option<String>,
    /// Writes acknowledged in the round (before the cut, the first after it, and the ones
    /// after that while cut).
    pub acknowledged: usize,
    /// Acknowledged writes missing or wrong in the final reads, as `key (where)`.
    pub lost: Vec<String>,
}

impl Round {
    /// Whether the round showed everything the issue asks for: the old leader stepped down
    /// while cut off, rejoined as a follower, and nothing acknowledged was lost.
    pub fn is_valid(&self) -> bool {
        self.step_down.is_some()
            && self.rejoin.is_some()
            && self.leader_after_heal.as_deref() != Some(self.old_leader.as_str())
            && self.new_leader != self.old_leader
            && self.lost.is_empty()
    }
}

/// One target's measurement.
#[derive(Debug)]
pub struct FailoverRun {
    pub target: Target,
    pub rounds: Vec<Round>,
    /// What stopped the run before all rounds were done, if anything.
    pub error: Option<String>,
}

impl FailoverRun {
    /// The median outage over the rounds (the lower middle one for an even count).
    pub fn median_outage(&self) -> Option<Duration> {
        median(self.rounds.iter().map(|r| r.outage).collect())
    }

    /// The median time to a new leader named by both survivors.
    pub fn median_elected(&self) -> Option<Duration> {
        median(self.rounds.iter().filter_map(|r| r.elected).collect())
    }

    /// The median step-down time over the rounds that stepped down.
    pub fn median_step_down(&self) -> Option<Duration> {
        median(self.rounds.iter().filter_map(|r| r.step_down).collect())
    }

    pub fn is_valid(&self) -> bool {
        self.error.is_none() && !self.rounds.is_empty() && self.rounds.iter().all(Round::is_valid)
    }

    /// The per-round table and the medians, as printed and written to the report.
    pub fn text(&self) -> String {
        let mut text = format!(
            "{}: cut-link failover, {} round(s)\n  round  cut-off  new leader  elected    \
             outage     failed  step-down  rejoin     after heal  acked  lost\n",
            self.target,
            self.rounds.len()
        );
        for (i, round) in self.rounds.iter().enumerate() {
            let _ = writeln!(
                text,
                "  {:>5}  {:<7}  {:<10}  {:<9}  {:<9}  {:>6}  {:<9}  {:<9}  {:<10}  {:>5}  {}",
                i + 1,
                round.old_leader,
                round.new_leader,
                millis(round.elected),
                millis(Some(round.outage)),
                round.failed_attempts,
                millis(round.step_down),
                millis(round.rejoin),
                round.leader_after_heal.as_deref().unwrap_or("-"),
                round.acknowledged,
                if round.lost.is_empty() {
                    "0".to_owned()
                } else {
                    round.lost.join(", ")
                }
            );
        }
        let _ = writeln!(
            text,
            "  median outage {}, median election {}, median step-down {}",
            millis(self.median_outage()),
            millis(self.median_elected()),
            millis(self.median_step_down())
        );
        if let Some(error) = &self.error {
            let _ = writeln!(text, "  stopped early: {error}");
        }
        text
    }
}

fn median(mut values: Vec<Duration>) -> Option<Duration> {
    values.sort();
    let middle = values.len().checked_sub(1)? / 2;
    values.get(middle).copied()
}

fn millis(duration: Option<Duration>) -> String {
    match duration {
        Some(d) => format!("{:.0} ms", d.as_secs_f64() * 1e3),
        None => "-".to_owned(),
    }
}

/// Runs the measurement for one target: a fresh cluster in network namespaces (root only),
/// `config.rounds` rounds, then everything removed. `Err` when the cluster could not be set
/// up; a round that went wrong is in the result (`error`, or a round that is not valid).
pub async fn measure(config: &FailoverConfig) -> Result<FailoverRun> {
    if !rustix::process::geteuid().is_root() {
        bail!("the cut-link measurement needs root (network namespaces and nft rules)");
    }
    if config.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if !config.bin.exists() {
        bail!(
            "{} binary {} not found",
            config.target,
            config.bin.display()
        );
    }
    std::fs::create_dir_all(&config.out_dir)
        .with_context(|| format!("create {}", config.out_dir.display()))?;
    // Dropped in reverse: the members, then the namespaces, then the lock.
    let run_lock = RunLock::acquire().await?;
    let network = Network::setup(NetworkMode::Namespaces)?;
    let cluster_config = Config::new(config.target, config.bin.clone(), config.out_dir.clone());
    let cluster =
        Cluster::start(&cluster_config, &network, run_lock.work_dir(), Clock::new()).await?;
    let mut ids = Vec::with_capacity(MEMBERS);
    for i in 0..MEMBERS {
        let status = cluster.status(i).await?;
        ids.push(status.header.map_or(0, |h| h.member_id));
    }
    let mut run = FailoverRun {
        target: config.target,
        rounds: Vec::new(),
        error: None,
    };
    for round in 0..config.rounds {
        match one_round(&cluster, &network, &ids, round).await {
            Ok(result) => {
                info!(
                    target = %config.target,
                    round = round + 1,
                    outage_ms = result.outage.as_millis() as u64,
                    step_down_ms = result.step_down.map(|d| d.as_millis() as u64),
                    rejoin_ms = result.rejoin.map(|d| d.as_millis() as u64),
                    lost = result.lost.len(),
                    "round done"
                );
                let rejoined = result.rejoin.is_some();
                run.rounds.push(result);
                if !rejoined {
                    run.error = Some(format!(
                        "round {}: the old leader did not rejoin within {REJOIN_MAX:?}",
                        round + 1
                    ));
                    break;
                }
            }
            Err(e) => {
                // Heal whatever the round left cut before giving up.
                if let Err(heal) = network.heal() {
                    warn!("heal after a failed round: {heal:#}");
                }
                run.error = Some(format!("round {}: {e:#}", round + 1));
                break;
            }
        }
        sleep(SETTLE).await;
    }
    Ok(run)
}

/// The Status of member `i`, or `None` when it does not answer in time.
async fn status(cluster: &Cluster, i: usize) -> Option<StatusResponse> {
    timeout(CALL_TIMEOUT, cluster.status(i)).await.ok()?.ok()
}

/// The member all of `members` name as leader, once they agree (its index in `ids`).
async fn agreed_leader(cluster: &Cluster, ids: &[u64], members: &[usize]) -> Option<usize> {
    let mut named = Vec::with_capacity(members.len());
    for &i in members {
        named.push(status(cluster, i).await?.leader);
    }
    let first = *named.first()?;
    if first == 0 || named.iter().any(|leader| *leader != first) {
        return None;
    }
    ids.iter().position(|id| *id == first)
}

/// One acknowledged write: `Ok(())` once `key` = `value` is acknowledged by `channel`'s member
/// within `limit`.
async fn put(channel: Channel, key: &str, value: &str, limit: Duration) -> Result<()> {
    let mut client = KvClient::new(channel);
    let call = client.put(PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: value.as_bytes().to_vec().into(),
        ..Default::default()
    });
    timeout(limit, call)
        .await
        .context("no answer in time")?
        .context("put")?;
    Ok(())
}

async fn one_round(
    cluster: &Cluster,
    network: &Network,
    ids: &[u64],
    round: usize,
) -> Result<Round> {
    let all: Vec<usize> = (0..MEMBERS).collect();
    let deadline = Instant::now() + LEADER_MAX;
    let leader = loop {
        if let Some(leader) = agreed_leader(cluster, ids, &all).await {
            break leader;
        }
        if Instant::now() > deadline {
            bail!("the members did not agree on a leader within {LEADER_MAX:?}");
        }
        sleep(STATUS_POLL).await;
    };
    let survivors: Vec<usize> = all.iter().copied().filter(|i| *i != leader).collect();
    let urls = cluster.client_urls();
    let channels: Vec<Channel> = urls
        .iter()
        .map(|url| lazy_channel(url))
        .collect::<Result<_>>()?;
    let prefix = format!("{KEY_PREFIX}{round}/");
    // key -> value of every acknowledged write of the round.
    let mut acknowledged = BTreeMap::new();
    let key = format!("{prefix}before");
    put(channels[leader].clone(), &key, "before", CALL_TIMEOUT)
        .await
        .context("the write before the cut")?;
    acknowledged.insert(key, "before".to_owned());

    let mut cut = Partition {
        blocked: Default::default(),
        mode: BlockMode::Blackhole,
    };
    for &other in &survivors {
        cut.blocked.insert((leader, other));
        cut.blocked.insert((other, leader));
    }
    let started = Instant::now();
    network.apply(&cut).context("cut the leader off")?;
    info!(
        round = round + 1,
        leader = cluster.name(leader),
        "leader cut off"
    );

    let writes = async {
        let mut failed = 0u64;
        let mut attempt = 0usize;
        loop {
            if started.elapsed() > OUTAGE_MAX {
                bail!("no write acknowledged within {OUTAGE_MAX:?} of the cut");
            }
            let via = survivors[attempt % survivors.len()];
            let key = format!("{prefix}outage-{attempt}");
            attempt += 1;
            match put(channels[via].clone(), &key, &key, ATTEMPT_TIMEOUT).await {
                Ok(()) => return Ok((started.elapsed(), failed, via, key)),
                Err(_) => failed += 1,
            }
        }
    };
    let step_down = async {
        loop {
            if started.elapsed() > STEP_DOWN_MAX {
                return None;
            }
            if let Some(status) = status(cluster, leader).await
                && status.leader != ids[leader]
            {
                return Some((started.elapsed(), status.leader));
            }
            sleep(STATUS_POLL).await;
        }
    };
    let elected = async {
        loop {
            if started.elapsed() > OUTAGE_MAX {
                return None;
            }
            if let Some(now) = agreed_leader(cluster, ids, &survivors).await
                && now != leader
            {
                return Some(started.elapsed());
            }
            sleep(STATUS_POLL).await;
        }
    };
    let (writes, step_down, elected) = tokio::join!(writes, step_down, elected);
    let (outage, failed_attempts, via, key) = writes?;
    acknowledged.insert(key.clone(), key);

    // The new leader, as the survivors name it once a write went through.
    let deadline = Instant::now() + LEADER_MAX;
    let new_leader = loop {
        if let Some(new_leader) = agreed_leader(cluster, ids, &survivors).await {
            break new_leader;
        }
        if Instant::now() > deadline {
            bail!("the survivors did not agree on a leader after a write went through");
        }
        sleep(STATUS_POLL).await;
    };
    for n in 0..WRITES_AFTER_OUTAGE {
        let key = format!("{prefix}after-{n}");
        put(channels[via].clone(), &key, &key, CALL_TIMEOUT)
            .await
            .with_context(|| format!("write {key} through a survivor after the failover"))?;
        acknowledged.insert(key.clone(), key);
    }

    network.heal().context("heal the cut")?;
    let healed = Instant::now();
    let mut rejoin = None;
    let mut leader_after_heal = None;
    while healed.elapsed() < REJOIN_MAX {
        if let Some(now) = agreed_leader(cluster, ids, &all).await
            && now != leader
            && read(&channels[leader], &prefix).await.is_ok()
        {
            rejoin = Some(healed.elapsed());
            leader_after_heal = Some(now);
            break;
        }
        sleep(STATUS_POLL).await;
    }

    let mut lost = Vec::new();
    let mut places = vec![leader_after_heal.unwrap_or(new_leader)];
    if rejoin.is_some() {
        places.push(leader);
    }
    for place in places {
        let held = read(&channels[place], &prefix)
            .await
            .with_context(|| format!("read the round's writes on {}", cluster.name(place)))?;
        for (key, value) in &acknowledged {
            if held.get(key) != Some(value) {
                lost.push(format!("{key} ({})", cluster.name(place)));
            }
        }
    }
    let (step_down, leader_named_after_step_down) = match step_down {
        Some((at, named)) => (Some(at), named),
        None => (None, ids[leader]),
    };
    Ok(Round {
        old_leader: cluster.name(leader).to_owned(),
        new_leader: cluster.name(new_leader).to_owned(),
        elected,
        outage,
        failed_attempts,
        step_down,
        leader_named_after_step_down,
        rejoin,
        leader_after_heal: leader_after_heal.map(|i| cluster.name(i).to_owned()),
        acknowledged: acknowledged.len(),
        lost,
    })
}

/// A linearizable Range of every key under `prefix` through `channel`'s member.
async fn read(channel: &Channel, prefix: &str) -> Result<BTreeMap<String, String>> {
    let mut client = KvClient::new(channel.clone());
    let call = client.range(RangeRequest {
        key: prefix.as_bytes().to_vec().into(),
        range_end: prefix_end(prefix.as_bytes()).into(),
        ..Default::default()
    });
    let response = timeout(CALL_TIMEOUT, call)
        .await
        .context("range timed out")?
        .context("range")?
        .into_inner();
    Ok(response
        .kvs
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                String::from_utf8_lossy(&kv.value).into_owned(),
            )
        })
        .collect())
}

/// The text of a run of several targets: each one's table, then the ratio of the first
/// target's median outage to each other's.
pub fn comparison_text(runs: &[FailoverRun]) -> String {
    let mut text = String::new();
    for run in runs {
        text.push_str(&run.text());
    }
    if let Some((first, rest)) = runs.split_first()
        && let Some(base) = first.median_outage()
    {
        for other in rest {
            if let Some(theirs) = other.median_outage() {
                let _ = writeln!(
                    text,
                    "median outage {} / {}: {:.2} ({} vs {})",
                    first.target,
                    other.target,
                    base.as_secs_f64() / theirs.as_secs_f64(),
                    millis(Some(base)),
                    millis(Some(theirs))
                );
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_middle_round() {
        let ms = Duration::from_millis;
        assert_eq!(median(vec![ms(30), ms(10), ms(20)]), Some(ms(20)));
        assert_eq!(median(vec![ms(40), ms(10), ms(30), ms(20)]), Some(ms(20)));
        assert_eq!(median(Vec::new()), None);
    }
}
