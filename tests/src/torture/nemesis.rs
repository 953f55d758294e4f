//! The nemesis: one fault at a time on a schedule (a quiet interval, then a fault held for a
//! while, then healed), each recorded as a [`FaultWindow`] on the run's clock.
//!
//! - Partition: a member cut from the others (a minority, or the leader), a bridge (two
//!   members cut from each other, the third sees both), or one way (a member, often the
//!   leader, that cannot receive, or cannot send); as silent drops or as resets.
//! - Kill: SIGKILL of the leader, a random member, or now and then all of them, restarted on
//!   their data dirs after the hold.
//! - Pause: SIGSTOP of the leader or a random member, SIGCONT after the hold.
//! - Membership: under load, remove a follower with the Cluster API, wipe its data dir, add it
//!   back as a learner at the same peer URL, start it with `--initial-cluster-state existing`
//!   and promote it once it has caught up (etcd's and skerry's replacement flow).
//!
//! Invariant: whatever the nemesis did is undone by [`Nemesis::heal_all`], which the run
//! calls whether or not the schedule ended in an error: cuts removed, frozen members thawed,
//! dead members restarted, a removed member added back and promoted.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use tokio::time::{Instant, sleep, sleep_until};
use tracing::{info, warn};

use super::cluster::Cluster;
use super::net::{BlockMode, Network, Partition};
use super::{Clock, Config, MEMBERS};

/// How long a removed member gets to notice and exit by itself before it is killed. Both
/// skerry and etcd stop within a heartbeat or two of applying their removal.
const REMOVED_EXIT_WAIT: Duration = Duration::from_secs(10);

/// How long each step of a membership change (remove, add, promote) may keep retrying. A
/// learner catching up by snapshot on a debug build takes seconds; etcd refuses to promote
/// until it has 90 % of the leader's log.
const MEMBERSHIP_STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Pause between retries of a membership step.
const MEMBERSHIP_RETRY: Duration = Duration::from_millis(500);

/// A fault is not started with less than this left before the deadline: it would be over
/// before it did anything. Two election timeouts.
const FAULT_DURATION_MIN: Duration = Duration::from_secs(2);

/// How long the nemesis looks for a leader before a leader-targeted fault picks at random.
/// Two election timeouts.
const LEADER_LOOKUP: Duration = Duration::from_secs(2);

/// The faults the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    Partition,
    Kill,
    Pause,
    Membership,
}

impl FaultKind {
    pub const ALL: [FaultKind; 4] = [
        FaultKind::Partition,
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Membership,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Partition => "partition",
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Membership => "membership",
        }
    }

    /// Parses `partition`, `kill,pause`, `kill+pause` or `all`.
    pub fn parse_list(text: &str) -> Result<Vec<FaultKind>> {
        let mut kinds = Vec::new();
        for word in text
            .split([',', '+'])
            .map(str::trim)
            .filter(|w| !w.is_empty())
        {
            if word == "all" {
                kinds.extend(FaultKind::ALL);
                continue;
            }
            let kind = FaultKind::ALL
                .into_iter()
                .find(|kind| kind.name() == word)
                .with_context(|| {
                    format!("unknown nemesis {word:?} (partition, kill, pause, membership, all)")
                })?;
            kinds.push(kind);
        }
        kinds.sort();
        kinds.dedup();
        if kinds.is_empty() {
            bail!("no nemesis given");
        }
        Ok(kinds)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One fault: what, to whom, and when it was in force (run clock, ns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultWindow {
    pub kind: FaultKind,
    pub detail: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Where an interrupted membership change stands, for `heal_all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Membership {
    /// `member` was removed; it is not yet added back.
    Removed { member: usize },
    /// `member` was added back as learner `id`; not yet promoted.
    Added { member: usize, id: u64 },
}

/// The fault schedule of one run; see the module doc.
pub struct Nemesis<'a> {
    network: &'a Network,
    clock: Clock,
    rng: StdRng,
    kinds: Vec<FaultKind>,
    next_kind: usize,
    interval: Duration,
    duration: Duration,
    windows: Vec<FaultWindow>,
    /// The window of the fault in force, if any, as an index into `windows`.
    open: Option<usize>,
    membership: Option<Membership>,
    /// Members that exited without the nemesis asking, with their exit status.
    crashes: Vec<String>,
}

impl<'a> Nemesis<'a> {
    pub fn new(config: &Config, clock: Clock, network: &'a Network) -> Nemesis<'a> {
        // Its own stream, apart from the clients' (which use seed + client id).
        let mut rng = StdRng::seed_from_u64(config.seed ^ 0x006e_656d_6573_6973);
        let next_kind = rng.random_range(0..config.nemeses.len().max(1));
        Nemesis {
            network,
            clock,
            rng,
            kinds: config.nemeses.clone(),
            next_kind,
            interval: config.fault_interval,
            duration: config.fault_duration,
            windows: Vec::new(),
            open: None,
            membership: None,
            crashes: Vec::new(),
        }
    }

    /// The recorded windows (any still open closed now) and the members that crashed.
    pub fn into_record(mut self) -> (Vec<FaultWindow>, Vec<String>) {
        self.close_window();
        (self.windows, self.crashes)
    }

    /// Notes members that exited by themselves since the last look.
    fn note_crashes(&mut self, cluster: &mut Cluster) {
        for crash in cluster.take_crashes() {
            warn!(%crash, "member crashed");
            let at = self.clock.now_ns() as f64 / 1e9;
            self.crashes
                .push(format!("{crash} (noticed at t={at:.3}s)"));
        }
    }

    /// `base` scaled by a random factor in [0.5, 1.5), so faults do not fall into lockstep
    /// with elections or generations.
    fn jitter(&mut self, base: Duration) -> Duration {
        base.mul_f64(self.rng.random_range(0.5..1.5))
    }

    fn open_window(&mut self, kind: FaultKind, detail: String) {
        self.close_window();
        info!(fault = %kind, %detail, "fault");
        self.windows.push(FaultWindow {
            kind,
            detail,
            start_ns: self.clock.now_ns(),
            end_ns: u64::MAX,
        });
        self.open = Some(self.windows.len() - 1);
    }

    fn close_window(&mut self) {
        if let Some(index) = self.open.take() {
            self.windows[index].end_ns = self.clock.now_ns();
            info!(fault = %self.windows[index].kind, "healed");
        }
    }

    /// Injects faults until `deadline`, healing each before the next.
    pub async fn run(&mut self, cluster: &mut Cluster, deadline: Instant) -> Result<()> {
        loop {
            let quiet_end = Instant::now() + self.jitter(self.interval);
            if quiet_end + FAULT_DURATION_MIN >= deadline {
                sleep_until(deadline).await;
                return Ok(());
            }
            sleep_until(quiet_end).await;
            self.note_crashes(cluster);
            let kind = self.kinds[self.next_kind % self.kinds.len()];
            self.next_kind += 1;
            let hold_end = (Instant::now() + self.jitter(self.duration)).min(deadline);
            match kind {
                FaultKind::Partition => self.partition(cluster, hold_end).await?,
                FaultKind::Kill => self.kill(cluster, hold_end).await?,
                FaultKind::Pause => self.pause(cluster, hold_end).await?,
                FaultKind::Membership => self.replace_member(cluster).await?,
            }
        }
    }

    async fn pick_leader_or_random(&mut self, cluster: &mut Cluster) -> (usize, &'static str) {
        match cluster.wait_leader(LEADER_LOOKUP).await {
            Some(leader) => (leader, "leader"),
            None => (self.rng.random_range(0..MEMBERS), "random member"),
        }
    }

    async fn partition(&mut self, cluster: &mut Cluster, hold_end: Instant) -> Result<()> {
        let mode = if self.rng.random_bool(0.3) {
            BlockMode::Reset
        } else {
            BlockMode::Blackhole
        };
        let others = |x: usize| (0..MEMBERS).filter(move |y| *y != x);
        let mut blocked = BTreeSet::new();
        let detail = match self.rng.random_range(0..5) {
            0 | 1 => {
                let (x, who) = if self.rng.random_bool(0.5) {
                    self.pick_leader_or_random(cluster).await
                } else {
                    (self.rng.random_range(0..MEMBERS), "random member")
                };
                for y in others(x) {
                    blocked.insert((x, y));
                    blocked.insert((y, x));
                }
                format!("isolate {} ({who}): minority | majority", cluster.name(x))
            }
            2 => {
                let bridge = self.rng.random_range(0..MEMBERS);
                let ends: Vec<usize> = others(bridge).collect();
                for &a in &ends {
                    for &b in &ends {
                        if a != b {
                            blocked.insert((a, b));
                        }
                    }
                }
                format!("bridge through {}", cluster.name(bridge))
            }
            3 => {
                let (x, who) = self.pick_leader_or_random(cluster).await;
                for y in others(x) {
                    blocked.insert((y, x));
                }
                format!("one-way: {} ({who}) hears nobody", cluster.name(x))
            }
            _ => {
                let (x, who) = self.pick_leader_or_random(cluster).await;
                for y in others(x) {
                    blocked.insert((x, y));
                }
                format!("one-way: nobody hears {} ({who})", cluster.name(x))
            }
        };
        let mode_name = match mode {
            BlockMode::Blackhole => "drop",
            BlockMode::Reset => "reset",
        };
        self.open_window(FaultKind::Partition, format!("{detail} [{mode_name}]"));
        self.network.apply(&Partition { blocked, mode })?;
        sleep_until(hold_end).await;
        self.network.heal()?;
        self.close_window();
        Ok(())
    }

    async fn kill(&mut self, cluster: &mut Cluster, hold_end: Instant) -> Result<()> {
        let (victims, detail): (Vec<usize>, String) = match self.rng.random_range(0..10) {
            0..5 => {
                let (x, who) = self.pick_leader_or_random(cluster).await;
                (vec![x], format!("kill -9 {} ({who})", cluster.name(x)))
            }
            5..9 => {
                let x = self.rng.random_range(0..MEMBERS);
                (
                    vec![x],
                    format!("kill -9 {} (random member)", cluster.name(x)),
                )
            }
            _ => ((0..MEMBERS).collect(), "kill -9 every member".to_owned()),
        };
        self.open_window(FaultKind::Kill, detail);
        for &victim in &victims {
            cluster.kill(victim).await?;
        }
        sleep_until(hold_end).await;
        for &victim in &victims {
            cluster.spawn(victim)?;
        }
        self.close_window();
        Ok(())
    }

    async fn pause(&mut self, cluster: &mut Cluster, hold_end: Instant) -> Result<()> {
        let (x, who) = if self.rng.random_bool(0.6) {
            self.pick_leader_or_random(cluster).await
        } else {
            (self.rng.random_range(0..MEMBERS), "random member")
        };
        self.open_window(
            FaultKind::Pause,
            format!("SIGSTOP {} ({who})", cluster.name(x)),
        );
        cluster.pause(x)?;
        sleep_until(hold_end).await;
        cluster.resume(x)?;
        self.close_window();
        Ok(())
    }

    /// Removes a follower, wipes it, adds it back as a learner and promotes it.
    async fn replace_member(&mut self, cluster: &mut Cluster) -> Result<()> {
        let Some(leader) = cluster.wait_leader(LEADER_LOOKUP * 5).await else {
            warn!("no leader: membership change skipped");
            return Ok(());
        };
        let followers: Vec<usize> = (0..MEMBERS).filter(|i| *i != leader).collect();
        let Some(&victim) = followers.choose(&mut self.rng) else {
            return Ok(());
        };
        let members = cluster.member_list(&[leader]).await?;
        if members.iter().any(|m| m.is_learner) || members.len() != MEMBERS {
            warn!(
                ?members,
                "membership not settled: membership change skipped"
            );
            return Ok(());
        }
        let victim_url = cluster.peer_url(victim).to_owned();
        let Some(old_id) = members
            .iter()
            .find(|m| m.peer_urls.contains(&victim_url))
            .map(|m| m.id)
        else {
            bail!(
                "{} ({victim_url}) is not in the member list",
                cluster.name(victim)
            );
        };
        self.open_window(
            FaultKind::Membership,
            format!(
                "remove {} ({old_id:x}), wipe, add back as learner, promote",
                cluster.name(victim)
            ),
        );
        // etcd refuses a removal until every remaining member has been connected for 5 s
        // ("unhealthy cluster"), which a member promoted moments ago is not: retry.
        let deadline = Instant::now() + MEMBERSHIP_STEP_TIMEOUT;
        loop {
            let via = self.voter(cluster, victim).await;
            let Err(e) = cluster.remove_member(via, old_id).await else {
                break;
            };
            // The answer may be lost while the removal went through: look before retrying.
            let members = cluster.member_list(&[via]).await.unwrap_or_default();
            if !members.is_empty() && members.iter().all(|m| m.id != old_id) {
                break;
            }
            if Instant::now() > deadline {
                warn!("member remove failed, membership change abandoned: {e:#}");
                if let Some(index) = self.open {
                    self.windows[index]
                        .detail
                        .push_str(&format!(" (abandoned: {e:#})"));
                }
                self.close_window();
                return Ok(());
            }
            sleep(MEMBERSHIP_RETRY).await;
        }
        self.membership = Some(Membership::Removed { member: victim });
        let exited = cluster.wait_exit(victim, REMOVED_EXIT_WAIT).await?;
        if !exited {
            warn!(
                member = cluster.name(victim),
                "removed member did not exit by itself; killed"
            );
        }
        cluster.wipe(victim)?;
        self.add_back(cluster, victim).await?;
        self.close_window();
        Ok(())
    }

    /// Adds removed `member` back as a learner, starts it empty, and promotes it.
    async fn add_back(&mut self, cluster: &mut Cluster, member: usize) -> Result<()> {
        let url = cluster.peer_url(member).to_owned();
        let deadline = Instant::now() + MEMBERSHIP_STEP_TIMEOUT;
        let (id, members) = loop {
            let via = self.voter(cluster, member).await;
            match cluster.add_learner(via, member).await {
                Ok(added) => break added,
                Err(e) => {
                    // A lost answer to an add that went through: the URL is now taken.
                    let members = cluster.member_list(&[via]).await.unwrap_or_default();
                    if let Some(found) = members.iter().find(|m| m.peer_urls.contains(&url)) {
                        break (found.id, members);
                    }
                    if Instant::now() > deadline {
                        return Err(e).context("add the removed member back");
                    }
                    sleep(MEMBERSHIP_RETRY).await;
                }
            }
        };
        self.membership = Some(Membership::Added { member, id });
        // etcd wants the current members and the new one's name; skerry reads the same list.
        let initial_cluster = members
            .iter()
            .filter_map(|m| {
                let peer = m.peer_urls.first()?;
                let name = if m.id == id || peer == &url {
                    cluster.name(member).to_owned()
                } else {
                    m.name.clone()
                };
                (!name.is_empty()).then(|| format!("{name}={peer}"))
            })
            .collect::<Vec<_>>()
            .join(",");
        cluster.set_join(member, initial_cluster);
        if !cluster.is_running(member) {
            cluster.spawn(member)?;
        }
        self.promote(cluster, member, id).await?;
        self.membership = None;
        Ok(())
    }

    /// Promotes learner `id` (member `member`) once the leader accepts it as caught up.
    async fn promote(&mut self, cluster: &mut Cluster, member: usize, id: u64) -> Result<()> {
        let deadline = Instant::now() + MEMBERSHIP_STEP_TIMEOUT;
        loop {
            let via = self.voter(cluster, member).await;
            match cluster.promote(via, id).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let members = cluster.member_list(&[via]).await.unwrap_or_default();
                    if members.iter().any(|m| m.id == id && !m.is_learner) {
                        return Ok(());
                    }
                    if Instant::now() > deadline {
                        return Err(e).context("promote the learner");
                    }
                    sleep(MEMBERSHIP_RETRY).await;
                }
            }
        }
    }

    /// A member other than `not` to send Cluster API calls to: the leader if known.
    async fn voter(&mut self, cluster: &mut Cluster, not: usize) -> usize {
        match cluster.leader().await {
            Some(leader) if leader != not => leader,
            _ => {
                let others: Vec<usize> = (0..MEMBERS).filter(|i| *i != not).collect();
                others.choose(&mut self.rng).copied().unwrap_or(0)
            }
        }
    }

    /// Undoes every fault: removes the cuts, thaws frozen members, restarts dead ones, and
    /// finishes an interrupted membership change.
    pub async fn heal_all(&mut self, cluster: &mut Cluster) -> Result<()> {
        self.network.heal()?;
        self.note_crashes(cluster);
        for i in 0..MEMBERS {
            if cluster.is_paused(i) {
                cluster.resume(i)?;
            }
        }
        match self.membership {
            Some(Membership::Removed { member }) => {
                if cluster.is_running(member) {
                    cluster.kill(member).await?;
                }
                cluster.wipe(member)?;
                self.add_back(cluster, member).await?;
            }
            Some(Membership::Added { member, id }) => {
                if !cluster.is_running(member) {
                    cluster.spawn(member)?;
                }
                self.promote(cluster, member, id).await?;
                self.membership = None;
            }
            None => {}
        }
        for i in 0..MEMBERS {
            if !cluster.is_running(i) {
                cluster.kill(i).await?;
                cluster.spawn(i)?;
            }
        }
        self.close_window();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nemesis_lists_parse() {
        assert_eq!(
            FaultKind::parse_list("all").expect("all"),
            FaultKind::ALL.to_vec()
        );
        assert_eq!(
            FaultKind::parse_list("pause+kill").expect("pair"),
            vec![FaultKind::Kill, FaultKind::Pause]
        );
        assert!(FaultKind::parse_list("flood").is_err());
        assert!(FaultKind::parse_list("").is_err());
    }
}
