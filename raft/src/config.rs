//! The cluster description from etcd's flags, validated, and the ids derived from it.
//!
//! `--initial-cluster n1=http://A:2380,n2=http://B:2380,...` names every member and its peer
//! URL; `--name` says which one we are. Member ids are derived from a member's peer URLs and
//! the cluster token, and the cluster id from the member ids, as etcd does (with SHA-256
//! where etcd uses SHA-1), so every member computes the same ids without talking.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::RaftError;

/// The heartbeat interval (etcd's `--heartbeat-interval`; etcd's default is 100 ms). Half
/// etcd's, so that an election timeout of [`ELECTION_TIMEOUT_DEFAULT`] still spans eight
/// heartbeats: a few lost or late ones never start an election.
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_millis(50);
/// The election timeout (etcd's `--election-timeout`; etcd's default is 1 s). A hung or
/// unplugged leader closes no connection, so its followers learn of it only from missing
/// heartbeats: raft-rs draws each follower's timeout between one and two of these, the first
/// of two followers fires after about 1.33 of them, and the election and first commit take a
/// few round trips more. At 400 ms that is about 0.5 s from the hang to the next acknowledged
/// write, under half of etcd's 1.29 s measured here (issue 21). Shorter is safe only because
/// nothing on the Raft loop waits on the disk (`crate::log`): etcd's own guidance is an
/// election timeout of ten round trips and more than the slowest fsync, and the loop's
/// heartbeats no longer depend on the fsync at all; an edge appliance's three boxes share one
/// LAN, with round trips under a millisecond.
pub const ELECTION_TIMEOUT_DEFAULT: Duration = Duration::from_millis(400);
/// etcd refuses an election timeout under five heartbeats: with fewer, one delayed heartbeat
/// starts an election.
pub const ELECTION_HEARTBEATS_MIN: u32 = 5;
/// etcd's upper bound on the election timeout (50 s): beyond it a dead leader goes unnoticed
/// for too long.
pub const ELECTION_TIMEOUT_MAX: Duration = Duration::from_secs(50);
/// etcd 3.4's default `--snapshot-count`: applied entries between log compactions. Fewer
/// means a smaller log and more frequent compaction; a member further behind than the log
/// reaches gets the store as a snapshot instead.
pub const SNAPSHOT_COUNT_DEFAULT: u64 = 100_000;
/// Entries kept in the log below the applied index when it is compacted (etcd's
/// `SnapshotCatchUpEntries`): a follower a little behind (a restart, a slow disk) catches up
/// from the log rather than needing the whole store.
pub const SNAPSHOT_CATCHUP_ENTRIES_DEFAULT: u64 = 5_000;
/// etcd's default `--initial-cluster-token`.
pub const CLUSTER_TOKEN_DEFAULT: &str = "etcd-cluster";

/// `--initial-cluster-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// Bootstrap a new cluster from `--initial-cluster`.
    New,
    /// Join a running cluster that already lists this member.
    Existing,
}

impl std::str::FromStr for ClusterState {
    type Err = RaftError;

    fn from_str(s: &str) -> Result<Self, RaftError> {
        match s {
            "new" => Ok(ClusterState::New),
            "existing" => Ok(ClusterState::Existing),
            other => Err(RaftError::Config(format!(
                "--initial-cluster-state must be new or existing, not {other:?}"
            ))),
        }
    }
}

/// One member of the initial cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
}

/// A validated cluster description.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This member's id.
    pub id: u64,
    pub name: String,
    pub cluster_id: u64,
    /// Every member, by id.
    pub members: BTreeMap<u64, Member>,
    pub state: ClusterState,
    /// Where this member accepts peer connections.
    pub listen_peer: SocketAddr,
    pub heartbeat: Duration,
    pub election: Duration,
    /// The peer URLs are `https://`: members speak mutual TLS (see [`crate::tls`]).
    pub peer_https: bool,
    /// Peer TLS, loaded from its files, present exactly when `peer_https`.
    pub peer_tls: Option<crate::tls::PeerTls>,
    /// `--snapshot-count`: applied entries between log compactions.
    pub snapshot_count: u64,
    /// `--experimental-snapshot-catchup-entries`: entries kept below the applied index.
    pub snapshot_catchup_entries: u64,
}

impl ClusterConfig {
    /// Validates etcd-style flags. `initial_cluster` is `name=url[,name=url...]` (a name may
    /// repeat for several URLs of one member); `listen_peer_urls` the URLs to accept peers on.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        initial_cluster: &str,
        token: &str,
        state: ClusterState,
        listen_peer_urls: &str,
        heartbeat: Duration,
        election: Duration,
    ) -> Result<ClusterConfig, RaftError> {
        if heartbeat.is_zero() {
            return Err(RaftError::Config(
                "--heartbeat-interval must be at least 1 ms".into(),
            ));
        }
        if election < heartbeat * ELECTION_HEARTBEATS_MIN {
            return Err(RaftError::Config(format!(
                "--election-timeout ({} ms) must be at least {ELECTION_HEARTBEATS_MIN} times \
                 --heartbeat-interval ({} ms)",
                election.as_millis(),
                heartbeat.as_millis()
            )));
        }
        if election > ELECTION_TIMEOUT_MAX {
            return Err(RaftError::Config(format!(
                "--election-timeout ({} ms) must be at most {} ms",
                election.as_millis(),
                ELECTION_TIMEOUT_MAX.as_millis()
            )));
        }
        let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut schemes = std::collections::BTreeSet::new();
        for item in initial_cluster.split(',').filter(|s| !s.is_empty()) {
            let (member, url) = item.split_once('=').ok_or_else(|| {
                RaftError::Config(format!(
                    "--initial-cluster: {item:?} is not name=url (e.g. n1=http://10.0.0.1:2380)"
                ))
            })?;
            peer_addr(url, "--initial-cluster")?;
            schemes.insert(url.starts_with("https://"));
            by_name
                .entry(member.to_string())
                .or_default()
                .push(url.to_string());
        }
        if by_name.is_empty() {
            return Err(RaftError::Config("--initial-cluster is empty".into()));
        }
        let mut members = BTreeMap::new();
        for (member, mut urls) in by_name {
            urls.sort();
            let id = member_id(&urls, token);
            if let Some(other) = members.insert(
                id,
                Member {
                    id,
                    name: member.clone(),
                    peer_urls: urls,
                },
            ) {
                return Err(RaftError::Config(format!(
                    "--initial-cluster: members {} and {member} have the same peer URLs",
                    other.name
                )));
            }
        }
        let me = members
            .values()
            .find(|m| m.name == name)
            .ok_or_else(|| {
                RaftError::Config(format!(
                    "--initial-cluster has no member named {name:?} (--name)"
                ))
            })?
            .clone();
        let listen = listen_peer_urls
            .split(',')
            .find(|s| !s.is_empty())
            .ok_or_else(|| RaftError::Config("--listen-peer-urls is empty".into()))?;
        let listen_peer = peer_addr(listen, "--listen-peer-urls")?;
        schemes.insert(listen.starts_with("https://"));
        if schemes.len() > 1 {
            return Err(RaftError::Config(
                "peer URLs mix http:// and https://; use one scheme for every member".into(),
            ));
        }
        let peer_https = schemes.contains(&true);
        let cluster_id = cluster_id(members.keys().copied());
        Ok(ClusterConfig {
            id: me.id,
            name: me.name,
            cluster_id,
            members,
            state,
            listen_peer,
            heartbeat,
            election,
            peer_https,
            peer_tls: None,
            snapshot_count: SNAPSHOT_COUNT_DEFAULT,
            snapshot_catchup_entries: SNAPSHOT_CATCHUP_ENTRIES_DEFAULT,
        })
    }

    /// Takes the ids a running cluster gave this member (`--initial-cluster-state existing`:
    /// `member add` chose our id, not the flags): the cluster id, ours, and every member's
    /// peer URL.
    pub fn join(&mut self, cluster_id: u64, id: u64, members: &[(u64, String)]) {
        let me = self.members.remove(&self.id);
        self.members = members
            .iter()
            .map(|(member, url)| {
                let name = if *member == id {
                    me.as_ref().map_or_else(String::new, |m| m.name.clone())
                } else {
                    String::new()
                };
                (
                    *member,
                    Member {
                        id: *member,
                        name,
                        peer_urls: vec![url.clone()],
                    },
                )
            })
            .collect();
        if let (Some(me), false) = (me, self.members.contains_key(&id)) {
            self.members.insert(id, Member { id, ..me });
        }
        self.cluster_id = cluster_id;
        self.id = id;
    }

    /// This member's own peer URLs (what others dial).
    pub fn advertise_peer_urls(&self) -> Vec<String> {
        self.members
            .get(&self.id)
            .map(|m| m.peer_urls.clone())
            .unwrap_or_default()
    }

    /// Adds the peer TLS files (`--peer-cert-file`, `--peer-key-file`,
    /// `--peer-trusted-ca-file`): required with `https://` peer URLs, refused without. They
    /// are loaded and checked here, before anything touches the data dir.
    pub fn with_peer_tls(
        mut self,
        files: Option<crate::tls::PeerTlsFiles>,
    ) -> Result<ClusterConfig, RaftError> {
        match (self.peer_https, files.is_some()) {
            (true, false) => Err(RaftError::Config(
                "https:// peer URLs need --peer-cert-file, --peer-key-file and \
                 --peer-trusted-ca-file"
                    .into(),
            )),
            (false, true) => Err(RaftError::Config(
                "--peer-cert-file and friends need https:// peer URLs".into(),
            )),
            _ => {
                self.peer_tls = files.as_ref().map(crate::tls::PeerTls::load).transpose()?;
                Ok(self)
            }
        }
    }

    /// Ticks between elections, for raft-rs (one tick per heartbeat).
    pub fn election_ticks(&self) -> usize {
        let ticks = self.election.as_millis() / self.heartbeat.as_millis().max(1);
        usize::try_from(ticks).unwrap_or(usize::MAX)
    }

    /// The peers' addresses, by id (this member excluded).
    pub fn peer_addrs(&self) -> Result<Vec<(u64, SocketAddr)>, RaftError> {
        let mut out = Vec::new();
        for m in self.members.values().filter(|m| m.id != self.id) {
            let url = m
                .peer_urls
                .first()
                .ok_or_else(|| RaftError::Config(format!("member {} has no peer URL", m.name)))?;
            out.push((m.id, peer_addr(url, "--initial-cluster")?));
        }
        Ok(out)
    }
}

/// A peer URL's socket address (`http://` or, with peer TLS, `https://`).
pub fn peer_addr(url: &str, flag: &str) -> Result<SocketAddr, RaftError> {
    let rest = if let Some(rest) = url.strip_prefix("http://") {
        rest
    } else if let Some(rest) = url.strip_prefix("https://") {
        rest
    } else {
        return Err(RaftError::Config(format!(
            "{flag}: {url} is not a URL like http://10.0.0.1:2380"
        )));
    };
    let host = rest.trim_end_matches('/');
    host.parse().map_err(|_| {
        RaftError::Config(format!(
            "{flag}: {url}: give an IP address and port (like http://10.0.0.1:2380)"
        ))
    })
}

/// A member's id: the first 8 bytes of SHA-256 over its sorted peer URLs and the cluster
/// token (etcd's recipe, with SHA-1). Never 0, which raft reserves for "none".
pub fn member_id(sorted_peer_urls: &[String], token: &str) -> u64 {
    let mut hasher = Sha256::new();
    for url in sorted_peer_urls {
        hasher.update(url.as_bytes());
    }
    hasher.update(token.as_bytes());
    nonzero(&hasher.finalize())
}

/// The cluster's id: SHA-256 over the sorted member ids.
pub fn cluster_id(ids: impl Iterator<Item = u64>) -> u64 {
    let mut ids: Vec<u64> = ids.collect();
    ids.sort_unstable();
    let mut hasher = Sha256::new();
    for id in ids {
        hasher.update(id.to_be_bytes());
    }
    nonzero(&hasher.finalize())
}

fn nonzero(digest: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&digest[..8]);
    // etcd's ids are shown as positive numbers; keep the top bit clear, and never 0.
    (u64::from_be_bytes(word) >> 1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str =
        "n1=http://127.0.0.1:2380,n2=http://127.0.0.1:2381,n3=http://127.0.0.1:2382";

    fn config(name: &str) -> Result<ClusterConfig, RaftError> {
        ClusterConfig::new(
            name,
            CLUSTER,
            CLUSTER_TOKEN_DEFAULT,
            ClusterState::New,
            "http://127.0.0.1:2380",
            HEARTBEAT_INTERVAL_DEFAULT,
            ELECTION_TIMEOUT_DEFAULT,
        )
    }

    #[test]
    fn every_member_derives_the_same_ids() {
        let a = config("n1").expect("n1");
        let b = config("n2").expect("n2");
        assert_eq!(a.cluster_id, b.cluster_id);
        assert_eq!(a.members, b.members);
        assert_ne!(a.id, b.id);
        assert_eq!(a.members.len(), 3);
        assert_eq!(a.election_ticks(), 8);
        assert_eq!(a.peer_addrs().expect("peers").len(), 2);
    }

    #[test]
    fn bad_flags_are_refused_with_the_flag_named() {
        let err = |r: Result<ClusterConfig, RaftError>| r.expect_err("refused").to_string();
        assert!(err(config("n9")).contains("--name"));
        assert!(
            err(ClusterConfig::new(
                "n1",
                "n1",
                CLUSTER_TOKEN_DEFAULT,
                ClusterState::New,
                "http://127.0.0.1:2380",
                HEARTBEAT_INTERVAL_DEFAULT,
                ELECTION_TIMEOUT_DEFAULT
            ))
            .contains("name=url")
        );
        assert!(
            err(ClusterConfig::new(
                "n1",
                CLUSTER,
                CLUSTER_TOKEN_DEFAULT,
                ClusterState::New,
                "http://127.0.0.1:2380",
                Duration::from_millis(100),
                Duration::from_millis(300)
            ))
            .contains("--election-timeout")
        );
        assert!(
            err(ClusterConfig::new(
                "n1",
                "n1=https://127.0.0.1:2380",
                CLUSTER_TOKEN_DEFAULT,
                ClusterState::New,
                "http://127.0.0.1:2380",
                HEARTBEAT_INTERVAL_DEFAULT,
                ELECTION_TIMEOUT_DEFAULT
            ))
            .contains("mix")
        );
        let https = ClusterConfig::new(
            "n1",
            "n1=https://127.0.0.1:2380",
            CLUSTER_TOKEN_DEFAULT,
            ClusterState::New,
            "https://127.0.0.1:2380",
            HEARTBEAT_INTERVAL_DEFAULT,
            ELECTION_TIMEOUT_DEFAULT,
        )
        .expect("https config");
        assert!(err(https.with_peer_tls(None)).contains("--peer-cert-file"));
        assert!("maybe".parse::<ClusterState>().is_err());
    }
}
