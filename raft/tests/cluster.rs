//! A three-member cluster in one test process, on loopback: writes on any member reach all,
//! linearizable reads see them, the leader's loss elects another and writes resume, and a
//! member that was down catches up from the log when it comes back.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use skerry_raft::{ClusterConfig, ClusterState, RaftNode};
use skerry_store::pb::etcdserverpb::{PutRequest, RangeRequest};
use skerry_store::replication::{MembershipChange, Replicator};
use skerry_store::{Store, StoreConfig, StoreError};
use skerry_tls::pki::{Ca, LeafSpec, Names, Usage};

/// Bound on every wait, so a bug fails the test instead of hanging it.
const WAIT: Duration = Duration::from_secs(20);
/// Short timeouts keep the test quick: elections take ~0.5 s instead of ~1 s.
const HEARTBEAT: Duration = Duration::from_millis(50);
const ELECTION: Duration = Duration::from_millis(500);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

struct Member {
    config: ClusterConfig,
    dir: PathBuf,
    store: Option<Store>,
    node: Option<RaftNode>,
}

impl Member {
    async fn start(&mut self) {
        let store = Store::open(StoreConfig {
            replicated: true,
            identity: Some((self.config.cluster_id, self.config.id)),
            ..StoreConfig::new(self.dir.join("store"))
        })
        .expect("open store");
        let node = RaftNode::start(&self.config, &self.dir.join("raft"), store.clone())
            .await
            .expect("start raft");
        self.store = Some(store);
        self.node = Some(node);
    }

    fn stop(&mut self) {
        if let Some(node) = self.node.take() {
            node.stop();
        }
        if let Some(store) = self.store.take() {
            store.close();
        }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("running")
    }

    fn leader(&self) -> u64 {
        self.node.as_ref().map_or(0, |n| n.handle().status().leader)
    }
}

fn cluster(root: &Path) -> Vec<Member> {
    cluster_with_scheme(root, "http")
}

fn cluster_with_scheme(root: &Path, scheme: &str) -> Vec<Member> {
    cluster_with(root, scheme, HEARTBEAT, ELECTION)
}

fn cluster_with(root: &Path, scheme: &str, heartbeat: Duration, election: Duration) -> Vec<Member> {
    let names = ["n1", "n2", "n3"];
    let ports: Vec<u16> = names.iter().map(|_| free_port()).collect();
    let initial = names
        .iter()
        .zip(&ports)
        .map(|(n, p)| format!("{n}={scheme}://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    names
        .iter()
        .zip(&ports)
        .map(|(name, port)| Member {
            config: ClusterConfig::new(
                name,
                &initial,
                "test-cluster",
                ClusterState::New,
                &format!("{scheme}://127.0.0.1:{port}"),
                heartbeat,
                election,
            )
            .expect("config"),
            dir: root.join(name),
            store: None,
            node: None,
        })
        .collect()
}

/// Waits until every running member agrees on a leader other than `not`.
async fn wait_for_leader(members: &[Member], not: u64) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let seen: Vec<u64> = members
            .iter()
            .filter(|m| m.node.is_some())
            .map(Member::leader)
            .collect();
        if let Some(&leader) = seen.first()
            && leader != 0
            && leader != not
            && seen.iter().all(|l| *l == leader)
        {
            return leader;
        }
        assert!(Instant::now() < deadline, "no agreed leader: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn put(store: &Store, key: &str, value: &str) -> Result<i64, StoreError> {
    let resp = store
        .put(PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
            ..Default::default()
        })
        .await?;
    Ok(resp.header.map_or(0, |h| h.revision))
}

/// Retries a put through elections (a write can meet "no leader" or a timeout meanwhile).
async fn put_eventually(store: &Store, key: &str, value: &str) -> i64 {
    let deadline = Instant::now() + WAIT;
    loop {
        match put(store, key, value).await {
            Ok(rev) => return rev,
            Err(e) => assert!(Instant::now() < deadline, "put {key} kept failing: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn linearizable_get(store: &Store, key: &str) -> Result<Option<Bytes>, StoreError> {
    store.linearizable_barrier().await?;
    let resp = store.range(&RangeRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        ..Default::default()
    })?;
    Ok(resp.kvs.first().map(|kv| kv.value.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_replicate_fail_over_and_catch_up() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut members = cluster(root.path());
    for m in &mut members {
        m.start().await;
    }
    let leader = wait_for_leader(&members, 0).await;

    // Writes through every member, leader and followers alike, in one order of revisions.
    let mut last = 0;
    for (i, m) in members.iter().enumerate() {
        for j in 0..20 {
            let rev = put_eventually(m.store(), &format!("k{i}-{j}"), &format!("v{i}-{j}")).await;
            assert!(rev > last, "revisions increase: {rev} after {last}");
            last = rev;
        }
    }
    // A linearizable read on every member sees the last write, at once.
    for m in &members {
        assert_eq!(
            linearizable_get(m.store(), "k2-19").await.expect("read"),
            Some(Bytes::from_static(b"v2-19"))
        );
    }
    // Many concurrent linearizable reads on all members at once: each member's ReadIndex
    // rounds must stay distinct at the leader (it ignores a context it already holds).
    let mut reads = Vec::new();
    for m in &members {
        for _ in 0..40 {
            let store = m.store().clone();
            reads.push(tokio::spawn(async move {
                linearizable_get(&store, "k0-0").await
            }));
        }
    }
    for read in reads {
        assert_eq!(
            read.await.expect("join").expect("concurrent read"),
            Some(Bytes::from_static(b"v0-0"))
        );
    }
    // Every member has the same history: same revision, same hash.
    for m in &members {
        m.store()
            .wait_applied(members[0].store().applied_index())
            .await
            .expect("applied");
    }
    let hashes: Vec<(u32, i64)> = members
        .iter()
        .map(|m| m.store().hash_kv(last).expect("hash"))
        .collect();
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");

    // Lose the leader: the other two elect a new one and take writes.
    let leader_at = members
        .iter()
        .position(|m| m.config.id == leader)
        .expect("leader is a member");
    let down_since = Instant::now();
    members[leader_at].stop();
    let survivors: Vec<usize> = (0..3).filter(|i| *i != leader_at).collect();
    wait_for_leader(&members, leader).await;
    let rev = put_eventually(members[survivors[0]].store(), "after", "failover").await;
    assert!(rev > last);
    eprintln!(
        "leader loss to first write on a survivor: {:?}",
        down_since.elapsed()
    );
    for _ in 0..50 {
        put_eventually(members[survivors[1]].store(), "more", "writes").await;
    }

    // The old leader comes back and catches up from the log.
    members[leader_at].start().await;
    let target = members[survivors[0]].store().applied_index();
    members[leader_at]
        .store()
        .wait_applied(target)
        .await
        .expect("caught up");
    assert_eq!(
        linearizable_get(members[leader_at].store(), "after")
            .await
            .expect("read"),
        Some(Bytes::from_static(b"failover"))
    );
    for m in &mut members {
        m.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_cannot_write_or_read_linearizably() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut members = cluster(root.path());
    for m in &mut members {
        m.start().await;
    }
    wait_for_leader(&members, 0).await;
    put_eventually(members[0].store(), "k", "before").await;
    // Two members gone: the one left is a minority.
    members[1].stop();
    members[2].stop();
    let alone = members[0].store();
    let write = put(alone, "k", "minority").await;
    assert!(
        matches!(
            write,
            Err(StoreError::NoLeader | StoreError::Timeout | StoreError::LeaderChanged)
        ),
        "{write:?}"
    );
    // Check-quorum makes a cut-off leader step down, so a read is refused rather than stale.
    let deadline = Instant::now() + WAIT;
    loop {
        match linearizable_get(alone, "k").await {
            Err(StoreError::NoLeader | StoreError::Timeout | StoreError::LeaderChanged) => break,
            Ok(_) => assert!(
                Instant::now() < deadline,
                "a minority kept serving linearizable reads"
            ),
            Err(e) => panic!("unexpected error {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Serializable reads still answer from the local store.
    let local = alone
        .range(&RangeRequest {
            key: Bytes::from_static(b"k"),
            serializable: true,
            ..Default::default()
        })
        .expect("serializable read");
    assert_eq!(local.kvs[0].value, Bytes::from_static(b"before"));
    for m in &mut members {
        m.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_on_a_follower_reach_the_leader_that_decides_expiry() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut members = cluster(root.path());
    for m in &mut members {
        m.start().await;
    }
    let leader = wait_for_leader(&members, 0).await;
    let follower = members
        .iter()
        .find(|m| m.config.id != leader)
        .expect("a follower");
    let store = follower.store();
    let (lease, ttl) = store.lease_grant(2, 0).await.expect("grant");
    assert_eq!(ttl, 2);
    store
        .put(PutRequest {
            key: Bytes::from_static(b"leased"),
            value: Bytes::from_static(b"v"),
            lease,
            ..Default::default()
        })
        .await
        .expect("put with lease");
    // Kept alive through the follower for twice the TTL: the leader must not expire it.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert!(store.lease_keep_alive(lease).is_some(), "lease vanished");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        linearizable_get(store, "leased").await.expect("read"),
        Some(Bytes::from_static(b"v"))
    );
    // Left alone, it expires (the leader revokes it) and its key goes everywhere.
    let deadline = Instant::now() + WAIT;
    loop {
        if linearizable_get(store, "leased")
            .await
            .expect("read")
            .is_none()
        {
            break;
        }
        assert!(Instant::now() < deadline, "lease never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for m in &mut members {
        m.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_serves_no_stale_read_and_catches_up_when_healed() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut members = cluster(root.path());
    for m in &mut members {
        m.start().await;
    }
    let leader = wait_for_leader(&members, 0).await;
    put_eventually(members[0].store(), "k", "before").await;
    let old = members
        .iter()
        .position(|m| m.config.id == leader)
        .expect("leader is a member");
    let others: Vec<usize> = (0..3).filter(|i| *i != old).collect();
    let other_ids: Vec<u64> = others.iter().map(|i| members[*i].config.id).collect();
    // Cut the leader off from both followers, both ways; the links stay up, so nothing
    // tells the followers but silence (the election timeout).
    members[old]
        .node
        .as_ref()
        .expect("running")
        .cut_off(&other_ids);
    for i in &others {
        members[*i]
            .node
            .as_ref()
            .expect("running")
            .cut_off(&[leader]);
    }
    // The majority elects a new leader and takes a write.
    let deadline = Instant::now() + WAIT;
    loop {
        let seen: Vec<u64> = others.iter().map(|i| members[*i].leader()).collect();
        if seen[0] != 0 && seen[0] != leader && seen[0] == seen[1] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "majority elected no leader: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    put_eventually(members[others[0]].store(), "k", "after").await;
    // The old leader, alone, must never answer a linearizable read with the old value, and
    // cannot write.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        match linearizable_get(members[old].store(), "k").await {
            Ok(value) => assert_ne!(
                value,
                Some(Bytes::from_static(b"before")),
                "stale linearizable read on a partitioned member"
            ),
            Err(StoreError::NoLeader | StoreError::Timeout | StoreError::LeaderChanged) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(put(members[old].store(), "k", "minority").await.is_err());
    // Healed, it learns the new leader and catches up.
    for m in &members {
        m.node.as_ref().expect("running").cut_off(&[]);
    }
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(Some(value)) = linearizable_get(members[old].store(), "k").await
            && value == Bytes::from_static(b"after")
        {
            break;
        }
        assert!(Instant::now() < deadline, "healed member never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for m in &mut members {
        m.stop();
    }
}

/// Writes a CA-signed certificate for 127.0.0.1 (server and client use) and its key; returns
/// their paths.
fn member_cert(dir: &Path, name: &str, ca: &Ca) -> (PathBuf, PathBuf) {
    let member = ca
        .issue(&LeafSpec::new(name, Usage::Both).names(Names::of(["127.0.0.1"])))
        .expect("issue a member certificate");
    let cert_path = dir.join(format!("{name}.crt"));
    let key_path = dir.join(format!("{name}.key"));
    member.write(&cert_path, &key_path).expect("write the pair");
    (cert_path, key_path)
}

/// A CA: its certificate written to `dir/{name}.crt`, and the CA that signs with it.
fn ca(dir: &Path, name: &str) -> (PathBuf, Ca) {
    let ca = Ca::generate(&format!("{name} CA")).expect("CA");
    let path = dir.join(format!("{name}.crt"));
    std::fs::write(&path, ca.cert_pem()).expect("write ca");
    (path, ca)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_speak_mutual_tls_and_a_member_with_a_foreign_certificate_is_shut_out() {
    let root = tempfile::tempdir().expect("tempdir");
    let pki = root.path().join("pki");
    std::fs::create_dir_all(&pki).expect("pki dir");
    let (cluster_ca, cluster_issuer) = ca(&pki, "cluster");
    let (_, rogue_ca) = ca(&pki, "rogue");
    let mut members = cluster_with_scheme(root.path(), "https");
    for (i, m) in members.iter_mut().enumerate() {
        // The third member's certificate comes from another CA (it trusts the cluster's).
        let issuer = if i == 2 { &rogue_ca } else { &cluster_issuer };
        let (cert, key) = member_cert(&pki, &format!("m{i}"), issuer);
        m.config = m
            .config
            .clone()
            .with_peer_tls(Some(skerry_raft::tls::PeerTlsFiles {
                cert,
                key,
                trusted_ca: cluster_ca.clone(),
            }))
            .expect("tls config");
    }
    for m in &mut members {
        m.start().await;
    }
    // The two members with cluster certificates are a quorum: they elect a leader between
    // them and take writes; the third never hears from them.
    let deadline = Instant::now() + WAIT;
    let leader = loop {
        let (a, b) = (members[0].leader(), members[1].leader());
        if a != 0 && a == b {
            break a;
        }
        assert!(Instant::now() < deadline, "no leader over TLS");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_ne!(leader, members[2].config.id);
    put_eventually(members[0].store(), "secret", "v").await;
    assert_eq!(
        linearizable_get(members[1].store(), "secret")
            .await
            .expect("read"),
        Some(Bytes::from_static(b"v"))
    );
    tokio::time::sleep(ELECTION).await;
    assert_eq!(members[2].leader(), 0, "the rogue member heard a leader");
    assert!(
        members[2].store().applied_index() < members[0].store().applied_index(),
        "the rogue member received entries"
    );
    for m in &mut members {
        m.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_behind_the_compacted_log_catches_up_by_snapshot() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut members = cluster(root.path());
    for m in &mut members {
        // Compact often and keep little, so a short outage leaves a member behind the log.
        m.config.snapshot_count = 100;
        m.config.snapshot_catchup_entries = 10;
        m.start().await;
    }
    let leader = wait_for_leader(&members, 0).await;
    let lagging = members
        .iter()
        .position(|m| m.config.id != leader)
        .expect("a follower");
    let writer = (0..3).find(|i| *i != lagging).expect("a live member");
    put_eventually(members[writer].store(), "early", "before the outage").await;
    for m in &members {
        m.store()
            .wait_applied(members[writer].store().applied_index())
            .await
            .expect("applied");
    }
    let behind = members[lagging].store().applied_index();
    members[lagging].stop();

    // Writes, a lease with a key on it, a compaction: all of it must arrive in the snapshot.
    let (lease, _) = members[writer]
        .store()
        .lease_grant(600, 0)
        .await
        .expect("lease");
    members[writer]
        .store()
        .put(PutRequest {
            key: Bytes::from_static(b"leased"),
            value: Bytes::from_static(b"v"),
            lease,
            ..Default::default()
        })
        .await
        .expect("leased put");
    let mut i = 0;
    let deadline = Instant::now() + WAIT;
    // Until both live members dropped the entries the lagging one needs (the store's durable
    // point, which bounds compaction, moves at its 5 s checkpoint).
    loop {
        for _ in 0..50 {
            put_eventually(members[writer].store(), &format!("k{i:05}"), "v").await;
            i += 1;
        }
        let compacted = members
            .iter()
            .filter_map(|m| m.node.as_ref())
            .all(|n| n.log_first_index() > behind + 1);
        if compacted {
            break;
        }
        assert!(Instant::now() < deadline, "the log was never compacted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mid = members[writer].store().revision() - 5;
    members[writer]
        .store()
        .compact(mid, false)
        .await
        .expect("compact");
    put_eventually(members[writer].store(), "last", "before the return").await;

    members[lagging].start().await;
    let target = members[writer].store().applied_index();
    members[lagging]
        .store()
        .wait_applied(target)
        .await
        .expect("the returning member catches up");
    assert!(
        members[lagging]
            .store()
            .installed_snapshot()
            .expect("read")
            .is_some(),
        "the member caught up without a snapshot"
    );
    let lagging_store = members[lagging].store();
    assert_eq!(lagging_store.compact_revision(), mid);
    let rev = members[writer].store().revision();
    assert_eq!(
        lagging_store.hash_kv(rev).expect("hash"),
        members[writer].store().hash_kv(rev).expect("hash"),
        "the snapshot holds the same history"
    );
    assert!(
        lagging_store.lease_ids().contains(&lease),
        "the lease came with the snapshot"
    );
    // And it goes on from the log after the snapshot, reads included.
    put_eventually(members[writer].store(), "after", "the snapshot").await;
    assert_eq!(
        linearizable_get(lagging_store, "after")
            .await
            .expect("read"),
        Some(Bytes::from_static(b"the snapshot"))
    );
    for m in &mut members {
        m.stop();
    }
}

/// Changes membership through `store`, retrying while the cluster is busy (an election, a
/// learner still catching up, a change in progress).
async fn change_membership(store: &Store, change: MembershipChange) -> Result<(), StoreError> {
    let deadline = Instant::now() + WAIT;
    loop {
        match store.change_membership(change.clone()).await {
            Err(
                StoreError::NoLeader
                | StoreError::LeaderChanged
                | StoreError::Timeout
                | StoreError::LearnerNotReady
                | StoreError::Unsupported(_),
            ) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_as_a_learner_is_promoted_and_a_member_is_removed() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut members = cluster(root.path());
    for m in &mut members {
        m.start().await;
    }
    let leader = wait_for_leader(&members, 0).await;
    let follower = members
        .iter()
        .position(|m| m.config.id != leader)
        .expect("a follower");
    for i in 0..30 {
        put_eventually(members[0].store(), &format!("k{i}"), "v").await;
    }

    // `member add --learner` through a follower: it forwards the change to the leader.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    change_membership(
        members[follower].store(),
        MembershipChange::Add {
            peer_urls: vec![url.clone()],
            learner: true,
        },
    )
    .await
    .expect("add a learner");
    // Listed on the member that applied it (the one asked answers once it has).
    let listed = members[follower].store().members().expect("members");
    let added = listed
        .iter()
        .find(|m| m.peer_urls == vec![url.clone()])
        .expect("the new member is listed");
    assert!(added.is_learner);
    let new_id = added.id;
    // The same URL again is refused, as etcd refuses it.
    assert_eq!(
        members[0]
            .store()
            .change_membership(MembershipChange::Add {
                peer_urls: vec![url.clone()],
                learner: true,
            })
            .await,
        Err(StoreError::PeerUrlExists)
    );

    // The new member starts with `--initial-cluster-state existing` and learns its id from
    // the cluster.
    let initial = members
        .iter()
        .map(|m| format!("{}={}", m.config.name, m.config.advertise_peer_urls()[0]))
        .chain(std::iter::once(format!("n4={url}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut config = ClusterConfig::new(
        "n4",
        &initial,
        "test-cluster",
        ClusterState::Existing,
        &url,
        HEARTBEAT,
        ELECTION,
    )
    .expect("config");
    // Asked of the member known to have applied the addition: another may not have yet, and
    // would answer that it knows no such member (id 0).
    let peer = config
        .peer_addrs()
        .expect("peers")
        .into_iter()
        .find(|(id, _)| *id == members[follower].config.id)
        .expect("the follower is a peer")
        .1;
    let answer = skerry_raft::transport::ask_to_join(peer, &url, &None)
        .await
        .expect("join answer");
    assert_eq!(answer.member_id, new_id);
    config.join(answer.cluster_id, answer.member_id, &answer.members);
    members.push(Member {
        config,
        dir: root.path().join("n4"),
        store: None,
        node: None,
    });
    members[3].start().await;
    members[3]
        .store()
        .wait_applied(members[0].store().applied_index())
        .await
        .expect("the learner catches up");
    assert_eq!(
        linearizable_get(members[3].store(), "k29")
            .await
            .expect("read"),
        Some(Bytes::from_static(b"v"))
    );

    // Promote it; a voter cannot be promoted, an unknown member not removed.
    change_membership(members[0].store(), MembershipChange::Promote { id: new_id })
        .await
        .expect("promote");
    assert_eq!(
        members[0]
            .store()
            .change_membership(MembershipChange::Promote { id: new_id })
            .await,
        Err(StoreError::MemberNotLearner)
    );
    assert_eq!(
        members[0]
            .store()
            .change_membership(MembershipChange::Remove { id: 12345 })
            .await,
        Err(StoreError::MemberNotFound)
    );
    members[3]
        .store()
        .wait_applied(members[0].store().applied_index())
        .await
        .expect("applied");
    let listed = members[3].store().members().expect("members");
    assert_eq!(listed.len(), 4);
    assert!(listed.iter().all(|m| !m.is_learner));

    // Remove the follower: it stops, and the other three go on.
    let gone = members[follower].config.id;
    change_membership(members[3].store(), MembershipChange::Remove { id: gone })
        .await
        .expect("remove");
    let deadline = Instant::now() + WAIT;
    while !members[follower]
        .node
        .as_ref()
        .is_some_and(|n| n.handle().removed())
    {
        assert!(Instant::now() < deadline, "the removed member did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    members[follower].stop();
    put_eventually(members[3].store(), "after", "removal").await;
    let listed = members[3].store().members().expect("members");
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|m| m.id != gone));
    // A removed member cannot come back as itself.
    let store = Store::open(StoreConfig {
        replicated: true,
        identity: Some((members[follower].config.cluster_id, gone)),
        ..StoreConfig::new(members[follower].dir.join("store"))
    })
    .expect("open store");
    let refused = RaftNode::start(
        &members[follower].config,
        &members[follower].dir.join("raft"),
        store.clone(),
    )
    .await;
    assert!(
        refused
            .as_ref()
            .err()
            .is_some_and(|e| e.to_string().contains("was removed")),
        "a removed member restarted"
    );
    store.close();
    for m in &mut members {
        m.stop();
    }
}

/// How long the half-second-stall run lasts: CI's default; the soak runs it for the issue's
/// ten minutes (`SKERRY_DISK_STALL_SECS=600`, see CONTRIBUTING.md).
const DISK_STALL_SECS_DEFAULT: u64 = 20;

/// Writes through every member until `until`, each member's writer on its own keys; returns
/// the (key, value) pairs acknowledged. Failed writes (a leader change) are retried.
fn spawn_writers(
    members: &[Member],
    until: Instant,
) -> Vec<tokio::task::JoinHandle<Vec<(String, String)>>> {
    members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let store = m.store().clone();
            tokio::spawn(async move {
                let mut acked = Vec::new();
                let mut n = 0u64;
                while Instant::now() < until {
                    let (key, value) = (format!("w{i}-{n}"), format!("v{n}"));
                    if put(&store, &key, &value).await.is_ok() {
                        acked.push((key, value));
                        n += 1;
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                acked
            })
        })
        .collect()
}

/// Every acknowledged write is there, read linearizably through `store`.
async fn assert_all_present(store: &Store, acked: &[(String, String)]) {
    store.linearizable_barrier().await.expect("barrier");
    for (key, value) in acked {
        let resp = store
            .range(&RangeRequest {
                key: Bytes::copy_from_slice(key.as_bytes()),
                ..Default::default()
            })
            .expect("range");
        assert_eq!(
            resp.kvs.first().map(|kv| kv.value.clone()),
            Some(Bytes::copy_from_slice(value.as_bytes())),
            "acknowledged write {key} lost"
        );
    }
}

/// Three members with skerry's default timeouts, started, once they agree on a leader: the
/// members, the leader's id and its index.
async fn default_cluster_with_leader(root: &Path) -> (Vec<Member>, u64, usize) {
    let mut members = cluster_with(
        root,
        "http",
        skerry_raft::config::HEARTBEAT_INTERVAL_DEFAULT,
        skerry_raft::config::ELECTION_TIMEOUT_DEFAULT,
    );
    for m in &mut members {
        m.start().await;
    }
    let leader = wait_for_leader(&members, 0).await;
    let li = members
        .iter()
        .position(|m| m.config.id == leader)
        .expect("leader is a member");
    (members, leader, li)
}

/// Issue 21: with skerry's default timeouts (heartbeat 50 ms, election 400 ms), a leader
/// whose every log sync stalls 100 to 500 ms more (an SD card on a bad day, through the
/// log's fault hook) keeps leading, in the same term, while clients write through every
/// member; nothing acknowledged is lost and the slow-disk alarm counts the stalls. It
/// failed before the log's writes left the Raft loop: a stall over the election timeout
/// held the leader's heartbeats, and the followers elected another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_disk_stalls_half_a_second_keeps_leading() {
    let secs = std::env::var("SKERRY_DISK_STALL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DISK_STALL_SECS_DEFAULT);
    let root = tempfile::tempdir().expect("tempdir");
    let (mut members, leader, li) = default_cluster_with_leader(root.path()).await;
    let term = members[li]
        .node
        .as_ref()
        .expect("running")
        .handle()
        .status()
        .term;
    let slow_before =
        skerry_store::metrics::WAL_SLOW_FSYNCS.load(std::sync::atomic::Ordering::Relaxed);
    let syncs = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = syncs.clone();
    members[li]
        .node
        .as_ref()
        .expect("running")
        .set_sync_fault(Some(std::sync::Arc::new(move || {
            // 100, 200, ... 500 ms, in turn.
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Duration::from_millis(100 * (n % 5 + 1))
        })));
    let until = Instant::now() + Duration::from_secs(secs);
    let writers = spawn_writers(&members, until);
    let mut seen = Vec::new();
    while Instant::now() < until {
        for m in &members {
            let status = m.node.as_ref().expect("running").handle().status();
            if status.leader != leader || status.term != term {
                seen.push((m.config.id, status.leader, status.term));
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.expect("writer"));
    }
    members[li]
        .node
        .as_ref()
        .expect("running")
        .set_sync_fault(None);
    assert!(
        seen.is_empty(),
        "leadership moved off {leader:x} (term {term}): (member, leader, term) {:?}",
        &seen[..seen.len().min(5)]
    );
    let stalled = syncs.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        stalled >= secs,
        "the leader's log synced only {stalled} times"
    );
    assert!(
        skerry_store::metrics::WAL_SLOW_FSYNCS.load(std::sync::atomic::Ordering::Relaxed)
            >= slow_before + stalled / 2,
        "the slow-disk alarm missed the stalls"
    );
    assert!(
        acked.len() as u64 > secs * 10,
        "only {} writes acknowledged",
        acked.len()
    );
    assert_all_present(members[(li + 1) % 3].store(), &acked).await;
    for m in &mut members {
        m.stop();
    }
}

/// Issue 21: a leader whose log sync stalls 3 s hands leadership to a follower once a sync
/// has taken `LEADER_DISK_STALL_MAX` (it would otherwise keep leading while its own clients'
/// writes wait on its disk), and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_disk_stalls_three_seconds_hands_over() {
    let root = tempfile::tempdir().expect("tempdir");
    let (mut members, leader, li) = default_cluster_with_leader(root.path()).await;
    let handovers =
        skerry_store::metrics::DISK_STALL_HANDOVERS.load(std::sync::atomic::Ordering::Relaxed);
    members[li]
        .node
        .as_ref()
        .expect("running")
        .set_sync_fault(Some(std::sync::Arc::new(|| Duration::from_secs(3))));
    let stalled_at = Instant::now();
    let until = stalled_at + Duration::from_secs(8);
    let writers = spawn_writers(&members, until);
    let new_leader = wait_for_leader(&members, leader).await;
    let moved_after = stalled_at.elapsed();
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.expect("writer"));
    }
    members[li]
        .node
        .as_ref()
        .expect("running")
        .set_sync_fault(None);
    assert_ne!(new_leader, leader);
    assert!(
        moved_after < Duration::from_secs(3),
        "leadership moved only after {moved_after:?}"
    );
    assert!(
        skerry_store::metrics::DISK_STALL_HANDOVERS.load(std::sync::atomic::Ordering::Relaxed)
            > handovers,
        "no handover counted"
    );
    assert!(!acked.is_empty(), "no write acknowledged");
    // The old leader follows the new one, and has every acknowledged write.
    assert_eq!(wait_for_leader(&members, leader).await, new_leader);
    assert_all_present(members[li].store(), &acked).await;
    for m in &mut members {
        m.stop();
    }
}
