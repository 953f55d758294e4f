//! Three `skerry server` processes on loopback forming one Raft cluster, driven by the real
//! etcdctl and by a gRPC client: writes on any member are read on every other; kill -9 of the
//! leader elects another and writes resume; the killed member catches up when it restarts;
//! a rolling restart (SIGTERM, one member at a time) under load loses no acknowledged write
//! and serves no stale linearizable read; `etcdctl move-leader` moves leadership.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Server, free_port};
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use skerry_store::pb::etcdserverpb::{MoveLeaderRequest, PutRequest, RangeRequest};

/// Bound on every wait in this file.
const WAIT: Duration = Duration::from_secs(30);
/// The cluster's flags: etcd's defaults, so the failover figure is the real one.
const NAMES: [&str; 3] = ["n1", "n2", "n3"];

struct Cluster {
    initial: String,
    peer_ports: Vec<u16>,
    client_ports: Vec<u16>,
    root: tempfile::TempDir,
    members: Vec<Option<Server>>,
    /// Flags every member gets beyond the cluster's.
    extra: Vec<String>,
}

impl Cluster {
    fn start() -> Cluster {
        Self::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Cluster {
        let peer_ports: Vec<u16> = NAMES.iter().map(|_| free_port()).collect();
        let initial = NAMES
            .iter()
            .zip(&peer_ports)
            .map(|(n, p)| format!("{n}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            initial,
            peer_ports,
            client_ports: NAMES.iter().map(|_| free_port()).collect(),
            root: tempfile::tempdir().expect("tempdir"),
            members: NAMES.iter().map(|_| None).collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for i in 0..NAMES.len() {
            cluster.start_member(i);
        }
        cluster
    }

    fn start_member(&mut self, i: usize) {
        self.start_member_with(i, &[]);
    }

    fn start_member_with(&mut self, i: usize, more: &[&str]) {
        let dir = self.member_dir(i);
        let listen = self.peer_url(i);
        let mut args = vec![
            "--name",
            NAMES[i],
            "--initial-cluster",
            &self.initial,
            "--listen-peer-urls",
            &listen,
            "--initial-advertise-peer-urls",
            &listen,
        ];
        args.extend(self.extra.iter().map(String::as_str));
        args.extend(more);
        let server = Server::start_on_port(&dir, self.client_ports[i], &args);
        self.members[i] = Some(server);
    }

    fn member_dir(&self, i: usize) -> std::path::PathBuf {
        self.root.path().join(NAMES[i])
    }

    fn peer_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.peer_ports[i])
    }

    fn member(&self, i: usize) -> &Server {
        self.members[i].as_ref().expect("member running")
    }

    fn endpoints(&self) -> String {
        self.members
            .iter()
            .flatten()
            .map(Server::endpoint)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the member every running member names as leader, once they agree.
    fn wait_for_leader(&self, not: Option<usize>) -> usize {
        let deadline = Instant::now() + WAIT;
        loop {
            let mut leaders = Vec::new();
            let mut ids = Vec::new();
            for m in self.members.iter().flatten() {
                let out = etcdctl(&m.endpoint(), &["endpoint", "status", "-w", "json"]);
                let parsed: serde_json::Value =
                    serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
                let status = &parsed[0]["Status"];
                leaders.push(status["leader"].as_u64().unwrap_or(0));
                ids.push(status["header"]["member_id"].as_u64().unwrap_or(0));
            }
            if let Some(&leader) = leaders.first()
                && leader != 0
                && leaders.iter().all(|l| *l == leader)
            {
                let running: Vec<usize> = (0..NAMES.len())
                    .filter(|i| self.members[*i].is_some())
                    .collect();
                if let Some(pos) = ids.iter().position(|id| *id == leader) {
                    let at = running[pos];
                    if Some(at) != not {
                        return at;
                    }
                }
            }
            assert!(Instant::now() < deadline, "no agreed leader: {leaders:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn etcdctl_raw(endpoints: &str, args: &[&str]) -> std::process::Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoints)
        .arg("--command-timeout=10s")
        .args(args)
        .output()
        .expect("run etcdctl")
}

fn etcdctl(endpoints: &str, args: &[&str]) -> String {
    let out = etcdctl_raw(endpoints, args);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sigterm(server: Server) {
    let pid = server.pid();
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success());
    let deadline = Instant::now() + WAIT;
    let mut server = server;
    while server.try_wait().is_none() {
        assert!(Instant::now() < deadline, "skerry ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn etcdctl_reads_on_every_member_what_another_wrote_and_the_cluster_survives_its_leader() {
    let mut cluster = Cluster::start();
    let leader = cluster.wait_for_leader(None);
    // A write through a follower, read on every member (linearizable by default).
    let follower = (leader + 1) % 3;
    let out = etcdctl_raw(
        &cluster.member(follower).endpoint(),
        &["put", "greeting", "hi"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 0..3 {
        assert_eq!(
            etcdctl(
                &cluster.member(i).endpoint(),
                &["get", "greeting", "--print-value-only"]
            ),
            "hi\n"
        );
    }
    // Every member lists every other with the client URL it published through the log.
    let deadline = Instant::now() + WAIT;
    loop {
        let members = etcdctl(&cluster.member(0).endpoint(), &["member", "list"]);
        let complete = NAMES.iter().all(|name| members.contains(name))
            && (0..3).all(|i| members.contains(&cluster.member(i).url()));
        if complete {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "member list incomplete: {members}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // kill -9 the leader: the others elect a new one and take writes.
    let killed = cluster.members[leader]
        .take()
        .expect("leader running")
        .kill();
    assert!(!killed.success());
    let started = Instant::now();
    let survivors = cluster.endpoints();
    loop {
        let out = etcdctl_raw(&survivors, &["put", "greeting", "after-failover"]);
        if out.status.success() {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "no write succeeded after the leader died"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "leader kill -9 to first acknowledged write: {:?}",
        started.elapsed()
    );
    let new_leader = cluster.wait_for_leader(Some(leader));
    assert_ne!(new_leader, leader);

    // The old leader restarts from its data dir and catches up.
    cluster.start_member(leader);
    let deadline = Instant::now() + WAIT;
    loop {
        let value = etcdctl(
            &cluster.member(leader).endpoint(),
            &["get", "greeting", "--print-value-only"],
        );
        if value == "after-failover\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "restarted member never caught up: {value:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn connect(endpoint: &str) -> Option<KvClient<tonic::transport::Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .ok()?;
    Some(KvClient::new(channel))
}

/// Writes `key = n` for n = 1, 2, ... on any member that answers, recording the last
/// acknowledged n; a failed write is retried with the same n (it may or may not have been
/// applied, which the checks allow).
async fn writer(endpoints: Vec<String>, acked: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let mut n = 1u64;
    let mut at = 0usize;
    while !stop.load(Ordering::Acquire) {
        let endpoint = &endpoints[at % endpoints.len()];
        let Some(mut kv) = connect(endpoint).await else {
            at += 1;
            continue;
        };
        loop {
            let req = PutRequest {
                key: Bytes::from_static(b"counter"),
                value: Bytes::from(n.to_string()),
                ..Default::default()
            };
            match kv.put(req).await {
                Ok(_) => {
                    acked.store(n, Ordering::Release);
                    n += 1;
                }
                Err(_) => {
                    at += 1;
                    break;
                }
            }
            if stop.load(Ordering::Acquire) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_nothing_and_reads_nothing_stale() {
    let mut cluster = tokio::task::spawn_blocking(|| {
        let cluster = Cluster::start();
        cluster.wait_for_leader(None);
        cluster
    })
    .await
    .expect("start");
    let endpoints: Vec<String> = (0..3).map(|i| cluster.member(i).endpoint()).collect();
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(writer(endpoints.clone(), acked.clone(), stop.clone()));

    let reads_done = Arc::new(AtomicU64::new(0));
    let reader_reads = reads_done.clone();
    let reader_acked = acked.clone();
    let reader_stop = stop.clone();
    let reader_endpoints = endpoints.clone();
    let reader = tokio::spawn(async move {
        let (mut reads, mut retried) = (0u64, 0u64);
        let mut at = 0usize;
        while !reader_stop.load(Ordering::Acquire) {
            // Linearizable: a read that starts after n was acknowledged returns n or later.
            let floor = reader_acked.load(Ordering::Acquire);
            let Some(mut kv) = connect(&reader_endpoints[at % 3]).await else {
                at += 1;
                retried += 1;
                continue;
            };
            let req = RangeRequest {
                key: Bytes::from_static(b"counter"),
                ..Default::default()
            };
            match kv.range(req).await {
                Ok(resp) => {
                    let seen = resp
                        .get_ref()
                        .kvs
                        .first()
                        .and_then(|kv| std::str::from_utf8(&kv.value).ok()?.parse::<u64>().ok())
                        .unwrap_or(0);
                    assert!(
                        seen >= floor,
                        "stale read: {seen} after {floor} was acknowledged"
                    );
                    reads += 1;
                    reader_reads.fetch_add(1, Ordering::Release);
                }
                Err(_) => {
                    // A member going down refuses or drops the request; like etcd's client,
                    // the reader retries on the next member, so no read is lost, and the
                    // check above is what proves none was stale.
                    at += 1;
                    retried += 1;
                }
            }
        }
        (reads, retried)
    });

    tokio::time::sleep(Duration::from_millis(500)).await;
    // The restarts block (each waits for its server), so they run off the runtime.
    let restart_acked = acked.clone();
    let cluster = tokio::task::spawn_blocking(move || {
        for (i, name) in NAMES.iter().enumerate() {
            let before = restart_acked.load(Ordering::Acquire);
            let server = cluster.members[i].take().expect("running");
            sigterm(server);
            cluster.start_member(i);
            // Writes kept going through the restart.
            let deadline = Instant::now() + WAIT;
            while restart_acked.load(Ordering::Acquire) < before + 20 {
                assert!(
                    Instant::now() < deadline,
                    "writes stalled after restarting {name}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        cluster
    })
    .await
    .expect("rolling restart");
    // Reads go on after the last restart until some have been checked against the writes.
    let deadline = Instant::now() + WAIT;
    while reads_done.load(Ordering::Acquire) < 20 {
        assert!(Instant::now() < deadline, "linearizable reads stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Release);
    writer.await.expect("writer");
    let (reads, retried) = reader.await.expect("reader");
    let last = acked.load(Ordering::Acquire);
    assert!(reads > 0);
    eprintln!("rolling restart: {last} writes acknowledged, {reads} reads, {retried} retried");
    // Every member ends with the last acknowledged write (or a later, unacknowledged one).
    for endpoint in &endpoints {
        let endpoint = endpoint.clone();
        let value = tokio::task::spawn_blocking(move || {
            etcdctl(&endpoint, &["get", "counter", "--print-value-only"])
        })
        .await
        .expect("get");
        let value: u64 = value.trim().parse().expect("a number");
        assert!(value >= last, "acknowledged write {last} lost: {value}");
    }
    drop(cluster);
}

/// Rounds of the cluster crash test: each kills one member (the leader every other round)
/// with SIGKILL and restarts it. `SKERRY_CLUSTER_CRASH_ROUNDS` runs more.
const CLUSTER_CRASH_ROUNDS_DEFAULT: usize = 6;

/// Writes unique keys `w{id}/{n}` through any member that answers, recording each key once
/// its put is acknowledged.
async fn unique_writer(
    id: usize,
    endpoints: Vec<String>,
    acked: Arc<std::sync::Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) {
    let mut n = 0u64;
    let mut at = id;
    while !stop.load(Ordering::Acquire) {
        let Some(mut kv) = connect(&endpoints[at % endpoints.len()]).await else {
            at += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        while !stop.load(Ordering::Acquire) {
            let key = format!("w{id}/{n:08}");
            let req = PutRequest {
                key: Bytes::from(key.clone()),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            };
            match kv.put(req).await {
                Ok(_) => {
                    acked.lock().expect("acked list").push(key);
                    n += 1;
                }
                Err(_) => {
                    // Unknown outcome: the next attempt uses a new key, so a write that did
                    // land is simply an extra key, never a lost one.
                    n += 1;
                    at += 1;
                    break;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_killed_again_and_again_lose_no_acknowledged_write() {
    let rounds = std::env::var("SKERRY_CLUSTER_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CLUSTER_CRASH_ROUNDS_DEFAULT);
    let cluster = tokio::task::spawn_blocking(|| {
        let cluster = Cluster::start();
        cluster.wait_for_leader(None);
        cluster
    })
    .await
    .expect("start");
    let endpoints: Vec<String> = (0..3).map(|i| cluster.member(i).endpoint()).collect();
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|id| {
            tokio::spawn(unique_writer(
                id,
                endpoints.clone(),
                acked.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let cluster = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        for round in 0..rounds {
            std::thread::sleep(Duration::from_millis(400));
            let victim = if round % 2 == 0 {
                cluster.wait_for_leader(None)
            } else {
                (round / 2) % 3
            };
            let killed = cluster.members[victim].take().expect("running").kill();
            assert!(!killed.success());
            std::thread::sleep(Duration::from_millis(300));
            cluster.start_member(victim);
        }
        cluster.wait_for_leader(None);
        cluster
    })
    .await
    .expect("crash rounds");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Release);
    for w in writers {
        w.await.expect("writer");
    }
    let acked = acked.lock().expect("acked list").clone();
    assert!(!acked.is_empty(), "no write was acknowledged");
    // Every member, once it has applied everything, holds every acknowledged key.
    for endpoint in &endpoints {
        let deadline = Instant::now() + WAIT;
        loop {
            let mut kv = connect(endpoint).await.expect("connect");
            // Linearizable first (waits until this member has applied the leader's commit),
            // then everything it holds locally.
            let _ = kv
                .range(RangeRequest {
                    key: Bytes::from_static(b"w0/"),
                    ..Default::default()
                })
                .await;
            let resp = kv
                .range(RangeRequest {
                    key: Bytes::from_static(b"w"),
                    range_end: Bytes::from_static(b"x"),
                    keys_only: true,
                    serializable: true,
                    ..Default::default()
                })
                .await
                .expect("range")
                .into_inner();
            let held: std::collections::HashSet<Bytes> =
                resp.kvs.into_iter().map(|kv| kv.key).collect();
            let missing: Vec<&String> = acked
                .iter()
                .filter(|k| !held.contains(k.as_bytes()))
                .collect();
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{endpoint} lacks {} acknowledged writes, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(5)]
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!(
        "cluster crash test: {rounds} kills, {} acknowledged writes, all on every member",
        acked.len()
    );
    drop(cluster);
}

/// The member ids `etcdctl member list -w json` shows, with their learner flag.
fn member_ids(endpoint: &str) -> Vec<(u64, bool)> {
    let out = etcdctl(endpoint, &["member", "list", "-w", "json"]);
    let parsed: serde_json::Value = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
    parsed["members"]
        .as_array()
        .map(|members| {
            members
                .iter()
                .map(|m| {
                    (
                        m["ID"].as_u64().unwrap_or(0),
                        m["isLearner"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_is_removed_added_back_with_etcdctl_and_catches_up_by_snapshot() {
    // Compact the log often, so the returning member is far behind its start.
    let mut cluster = tokio::task::spawn_blocking(|| {
        let cluster = Cluster::start_with(&[
            "--snapshot-count",
            "200",
            "--experimental-snapshot-catchup-entries",
            "20",
        ]);
        cluster.wait_for_leader(None);
        cluster
    })
    .await
    .expect("start");
    let endpoints: Vec<String> = (0..3).map(|i| cluster.member(i).endpoint()).collect();
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(writer(endpoints.clone(), acked.clone(), stop.clone()));
    let result = tokio::task::spawn_blocking(move || {
        let leader = cluster.wait_for_leader(None);
        let gone = (leader + 1) % 3;
        let other = (leader + 2) % 3;
        let ids = member_ids(&cluster.member(leader).endpoint());
        assert_eq!(ids.len(), 3, "{ids:?}");
        let gone_id = {
            let out = etcdctl(
                &cluster.member(gone).endpoint(),
                &["endpoint", "status", "-w", "json"],
            );
            let parsed: serde_json::Value = serde_json::from_str(&out).expect("status json");
            parsed[0]["Status"]["header"]["member_id"]
                .as_u64()
                .expect("member id")
        };

        // Remove it: it stops by itself, saying why.
        let out = etcdctl_raw(
            &cluster.member(leader).endpoint(),
            &["member", "remove", &format!("{gone_id:x}")],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut removed = cluster.members[gone].take().expect("running");
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = removed.try_wait() {
                break status;
            }
            assert!(Instant::now() < deadline, "the removed member kept running");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(!status.success());
        assert!(
            removed.logs().contains("removed from the cluster"),
            "{}",
            removed.logs()
        );
        assert_eq!(member_ids(&cluster.member(leader).endpoint()).len(), 2);

        // Its box is wiped. Meanwhile the others go on, and compact their logs (the store's
        // durable point, which bounds compaction, moves at its 5 s checkpoint).
        std::fs::remove_dir_all(cluster.member_dir(gone)).expect("wipe");
        std::thread::sleep(Duration::from_secs(6));

        // `member add --learner` with the same peer URL, then the box starts empty and joins.
        let out = etcdctl_raw(
            &cluster.member(other).endpoint(),
            &[
                "member",
                "add",
                NAMES[gone],
                &format!("--peer-urls={}", cluster.peer_url(gone)),
                "--learner",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Listed by the member asked, which answered once it applied the change.
        let ids = member_ids(&cluster.member(other).endpoint());
        let (new_id, _) = *ids
            .iter()
            .find(|(_, learner)| *learner)
            .expect("the new member is listed as a learner");
        assert_ne!(new_id, gone_id, "a member added again gets a new id");
        cluster.start_member_with(gone, &["--initial-cluster-state", "existing"]);
        let deadline = Instant::now() + WAIT;
        while !cluster
            .member(gone)
            .logs()
            .contains("installed a snapshot from the leader")
        {
            assert!(
                Instant::now() < deadline,
                "the new member did not receive a snapshot: {}",
                cluster.member(gone).logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }

        // Promote it once it has caught up (etcd refuses before).
        let deadline = Instant::now() + WAIT;
        loop {
            let out = etcdctl_raw(
                &cluster.member(leader).endpoint(),
                &["member", "promote", &format!("{new_id:x}")],
            );
            if out.status.success() {
                break;
            }
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(err.contains("in sync with leader"), "{err}");
            assert!(Instant::now() < deadline, "never promoted: {err}");
            std::thread::sleep(Duration::from_millis(200));
        }
        let deadline = Instant::now() + WAIT;
        loop {
            // The new member lists itself a voter once it has applied its promotion.
            let ids = member_ids(&cluster.member(gone).endpoint());
            if ids.len() == 3 && ids.iter().all(|(_, learner)| !learner) {
                break;
            }
            assert!(Instant::now() < deadline, "{ids:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    })
    .await;
    let cluster = match result {
        Ok(cluster) => cluster,
        Err(e) => {
            stop.store(true, Ordering::Release);
            std::panic::resume_unwind(e.into_panic());
        }
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Release);
    load.await.expect("writer");
    let last = acked.load(Ordering::Acquire);
    assert!(
        last > 0,
        "no write was acknowledged under the membership changes"
    );
    // Every acknowledged write is on every member, the rebuilt one included.
    for endpoint in &endpoints {
        let mut kv = connect(endpoint).await.expect("connect");
        let resp = kv
            .range(RangeRequest {
                key: Bytes::from_static(b"counter"),
                ..Default::default()
            })
            .await
            .expect("linearizable read")
            .into_inner();
        let value: u64 = std::str::from_utf8(&resp.kvs[0].value)
            .expect("utf8")
            .parse()
            .expect("number");
        assert!(
            value >= last,
            "{endpoint}: counter {value} < acknowledged {last}"
        );
    }
    drop(cluster);
}

/// This member's id, from its own `endpoint status`.
fn own_id(endpoint: &str) -> u64 {
    let out = etcdctl(endpoint, &["endpoint", "status", "-w", "json"]);
    let parsed: serde_json::Value = serde_json::from_str(&out).expect("status json");
    parsed[0]["Status"]["header"]["member_id"]
        .as_u64()
        .expect("member id")
}

/// etcdctl's outcome of one command: exit success, stdout, and the `Error: ...` line.
fn outcome(out: &std::process::Output) -> (bool, String, String) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error = stderr
        .lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or("")
        .to_string();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        error,
    )
}

#[test]
fn etcdctl_move_leader_hands_leadership_over_and_refuses_as_etcd_does() {
    let mut cluster = Cluster::start();
    let leader = cluster.wait_for_leader(None);
    let ids: Vec<u64> = (0..3)
        .map(|i| own_id(&cluster.member(i).endpoint()))
        .collect();
    let all = cluster.endpoints();

    // etcdctl finds the leader among its endpoints and asks it; the answer comes once the
    // named member leads, and every member agrees it does.
    let target = (leader + 1) % 3;
    let out = etcdctl_raw(&all, &["move-leader", &format!("{:x}", ids[target])]);
    assert_eq!(
        outcome(&out),
        (
            true,
            format!(
                "Leadership transferred from {:x} to {:x}\n",
                ids[leader], ids[target]
            ),
            String::new()
        )
    );
    assert_eq!(cluster.wait_for_leader(None), target);
    // Writes go on under the new leader.
    let out = etcdctl_raw(&all, &["put", "after-move", "1"]);
    assert!(out.status.success(), "{:?}", outcome(&out));

    // The leader itself as target: done at once.
    let out = etcdctl_raw(&all, &["move-leader", &format!("{:x}", ids[target])]);
    assert_eq!(
        outcome(&out),
        (
            true,
            format!(
                "Leadership transferred from {:x} to {:x}\n",
                ids[target], ids[target]
            ),
            String::new()
        )
    );
    // No such member; a learner: etcd's refusal, FailedPrecondition.
    let out = etcdctl_raw(&all, &["move-leader", "1234"]);
    assert_eq!(
        outcome(&out),
        (
            false,
            String::new(),
            "Error: etcdserver: bad leader transferee".into()
        )
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("code = FailedPrecondition"));
    let learner_url = format!("http://127.0.0.1:{}", free_port());
    let added = etcdctl_raw(
        &all,
        &[
            "member",
            "add",
            "l1",
            "--learner",
            "--peer-urls",
            &learner_url,
        ],
    );
    assert!(added.status.success(), "{:?}", outcome(&added));
    let learner = member_ids(&cluster.member(target).endpoint())
        .into_iter()
        .find(|(_, learner)| *learner)
        .map(|(id, _)| id)
        .expect("the learner is listed");
    let out = etcdctl_raw(&all, &["move-leader", &format!("{learner:x}")]);
    assert_eq!(
        outcome(&out).2,
        "Error: etcdserver: bad leader transferee",
        "{:?}",
        outcome(&out)
    );
    let removed = etcdctl_raw(&all, &["member", "remove", &format!("{learner:x}")]);
    assert!(removed.status.success(), "{:?}", outcome(&removed));

    // Only a follower given: etcdctl finds no leader to ask. Asked directly, a follower
    // refuses with etcd's "not leader".
    let follower = (target + 1) % 3;
    let out = etcdctl_raw(
        &cluster.member(follower).endpoint(),
        &["move-leader", &format!("{:x}", ids[follower])],
    );
    assert_eq!(
        outcome(&out).2,
        format!(
            "Error: no leader endpoint given at [{}]",
            cluster.member(follower).endpoint()
        )
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let refused = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(cluster.member(follower).url())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        MaintenanceClient::new(channel)
            .move_leader(MoveLeaderRequest {
                target_id: ids[follower],
            })
            .await
            .expect_err("a follower refuses")
    });
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(refused.message(), "etcdserver: not leader");

    // A target that is down never takes over: the leader gives up after etcd's request
    // timeout with etcd's text (a client whose deadline is shorter sees its deadline pass
    // first, as with etcd).
    let down = cluster.members[follower].take().expect("running").kill();
    assert!(!down.success());
    let live = cluster.endpoints();
    let started = Instant::now();
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(&live)
        .arg("--command-timeout=30s")
        .args(["move-leader", &format!("{:x}", ids[follower])])
        .output()
        .expect("run etcdctl");
    let waited = started.elapsed();
    // etcd sends this one as code Unknown (its `togRPCError` has no entry for it), and the
    // client library knows no typed error for it, so etcdctl prints the gRPC status whole.
    assert_eq!(
        outcome(&out),
        (
            false,
            String::new(),
            "Error: rpc error: code = Unknown desc = etcdserver: request timed out, leader \
             transfer took too long"
                .into()
        )
    );
    assert!(
        (Duration::from_secs(6)..Duration::from_secs(20)).contains(&waited),
        "gave up after {waited:?}"
    );
    // The aborted transfer leaves the cluster writable, under the same leader.
    let out = etcdctl_raw(&live, &["put", "after-timeout", "1"]);
    assert!(out.status.success(), "{:?}", outcome(&out));
    assert_eq!(cluster.wait_for_leader(None), target);
}

/// Writes `fill/0` .. `fill/9` over and over with 16 KiB values through `endpoint` until the
/// cluster refuses for want of space; returns each key's last acknowledged value.
fn fill_until_refused(endpoint: &str) -> Vec<String> {
    let mut last = vec![String::new(); 10];
    for round in 0..2_000 {
        let value = format!("{round:05}-{}", "v".repeat(16 * 1024));
        let out = etcdctl_raw(endpoint, &["put", &format!("fill/{}", round % 10), &value]);
        if out.status.success() {
            last[round % 10] = value;
            continue;
        }
        assert_eq!(
            outcome(&out).2,
            "Error: etcdserver: mvcc: database space exceeded",
            "{:?}",
            outcome(&out)
        );
        assert!(round > 10, "refused after {round} writes");
        return last;
    }
    panic!("2,000 writes of 16 KiB fit in a 1 MiB quota");
}

/// Member `i` refuses a write with etcd's out-of-space error and reads every `fill/N` key as
/// last written.
fn check_out_of_space(cluster: &Cluster, i: usize, last: &[String]) {
    let endpoint = cluster.member(i).endpoint();
    let out = etcdctl_raw(&endpoint, &["put", "x", "y"]);
    assert_eq!(
        outcome(&out),
        (
            false,
            String::new(),
            "Error: etcdserver: mvcc: database space exceeded".into()
        ),
        "member {i}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("code = ResourceExhausted"));
    for (key, value) in last.iter().enumerate() {
        assert_eq!(
            etcdctl(
                &endpoint,
                &["get", &format!("fill/{key}"), "--print-value-only"]
            ),
            format!("{value}\n"),
            "member {i}, fill/{key}"
        );
    }
}

#[test]
fn a_cluster_out_of_space_refuses_writes_on_every_member_until_disarmed() {
    let mut cluster = Cluster::start_with(&["--quota-backend-bytes", "1048576"]);
    let leader = cluster.wait_for_leader(None);
    let ids: Vec<u64> = (0..3)
        .map(|i| own_id(&cluster.member(i).endpoint()))
        .collect();
    let follower = (leader + 1) % 3;
    let out = etcdctl_raw(
        &cluster.member(follower).endpoint(),
        &["put", "scratch", "1"],
    );
    assert!(out.status.success(), "{:?}", outcome(&out));
    let last = fill_until_refused(&cluster.member(follower).endpoint());

    // The alarm is the cluster's: every member refuses writes (a member past its own quota
    // raises its own alarm as it refuses), and every member lists the same alarms.
    for i in 0..3 {
        check_out_of_space(&cluster, i, &last);
    }
    let alarms = etcdctl(&cluster.member(leader).endpoint(), &["alarm", "list"]);
    assert!(!alarms.is_empty());
    for line in alarms.lines() {
        let id: u64 = line
            .strip_prefix("memberID:")
            .and_then(|rest| rest.strip_suffix(" alarm:NOSPACE "))
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("not an alarm line: {line:?}"));
        assert!(ids.contains(&id), "{line}");
    }
    for i in 0..3 {
        let listed = etcdctl(&cluster.member(i).endpoint(), &["alarm", "list"]);
        assert_eq!(listed, alarms, "member {i}");
    }
    // Deletes go on.
    assert_eq!(
        etcdctl(&cluster.member(leader).endpoint(), &["del", "scratch"]),
        "1\n"
    );
    // A member that restarts keeps the alarm and goes on refusing.
    let restarted = (leader + 2) % 3;
    assert!(
        !cluster.members[restarted]
            .take()
            .expect("running")
            .kill()
            .success()
    );
    cluster.start_member(restarted);
    cluster.wait_for_leader(None);
    check_out_of_space(&cluster, restarted, &last);
    let listed = etcdctl(&cluster.member(restarted).endpoint(), &["alarm", "list"]);
    assert_eq!(listed, alarms, "member {restarted} after its restart");

    // Compaction and defragmentation of every member free the space; disarmed, every
    // member takes writes again, and nothing written before is lost.
    let all = cluster.endpoints();
    let out = etcdctl(
        &cluster.member(leader).endpoint(),
        &["get", "fill/0", "-w", "json"],
    );
    let parsed: serde_json::Value = serde_json::from_str(&out).expect("get json");
    let revision = parsed["header"]["revision"].as_i64().expect("revision");
    let out = etcdctl_raw(&all, &["compact", &revision.to_string(), "--physical"]);
    assert!(out.status.success(), "{:?}", outcome(&out));
    let out = etcdctl_raw(&all, &["defrag"]);
    assert!(out.status.success(), "{:?}", outcome(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 3);
    let out = etcdctl_raw(&all, &["alarm", "disarm"]);
    assert_eq!(outcome(&out), (true, alarms.clone(), String::new()));
    for i in 0..3 {
        let endpoint = cluster.member(i).endpoint();
        assert_eq!(etcdctl(&endpoint, &["alarm", "list"]), "", "member {i}");
        let out = etcdctl_raw(&endpoint, &["put", &format!("after/{i}"), "y"]);
        assert!(out.status.success(), "member {i}: {:?}", outcome(&out));
        for (key, value) in last.iter().enumerate() {
            assert_eq!(
                etcdctl(
                    &endpoint,
                    &["get", &format!("fill/{key}"), "--print-value-only"]
                ),
                format!("{value}\n"),
                "member {i}, fill/{key}"
            );
        }
    }
}

/// `curl` GET of `url`: the status and the body.
fn curl_get(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}", url])
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn health_turns_false_on_a_member_whose_peers_are_down_and_the_leader_measures_round_trips() {
    let mut cluster = Cluster::start();
    let leader = cluster.wait_for_leader(None);
    for i in 0..NAMES.len() {
        let (code, body) = curl_get(&format!("{}/health", cluster.member(i).url()));
        assert_eq!(
            (code, body.as_str()),
            (200, r#"{"health":"true"}"#),
            "member {i}"
        );
    }
    // The leader times its heartbeats to each follower (etcd's per-peer round-trip
    // histogram, labelled with the peer's id in hex).
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, metrics) = curl_get(&format!("{}/metrics", cluster.member(leader).url()));
        let peers = metrics
            .lines()
            .filter(|l| {
                l.starts_with("etcd_network_peer_round_trip_time_seconds_count{To=\"")
                    && !l.ends_with(" 0")
            })
            .count();
        if peers == NAMES.len() - 1 {
            assert!(metrics.contains("etcd_server_is_leader 1"), "{metrics}");
            // etcd 3.4.23's help and buckets (0.1 ms doubling to 3.2768 s).
            assert!(metrics.contains(
                "# HELP etcd_network_peer_round_trip_time_seconds Round-Trip-Time histogram between peers\n"
            ));
            assert!(metrics.contains(",le=\"3.2768\"}"), "{metrics}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no round trips measured:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Alone, member 0 has no leader (and no quorum for a read): unhealthy, 503 as etcd says.
    for i in 1..NAMES.len() {
        cluster.members[i].take().expect("running").kill();
    }
    let url = cluster.member(0).url();
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, body) = curl_get(&format!("{url}/health"));
        if code == 503 {
            assert_eq!(body, "{\"health\":\"false\"}\n");
            break;
        }
        assert_eq!((code, body.as_str()), (200, r#"{"health":"true"}"#));
        assert!(Instant::now() < deadline, "still healthy without its peers");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A leader cut off from its quorum is first unhealthy for want of a quorum read; once
    // check-quorum makes it step down there is no leader at all, which stays unhealthy.
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, metrics) = curl_get(&format!("{url}/metrics"));
        if metrics.contains("\netcd_server_has_leader 0\n") {
            assert!(metrics.contains("\netcd_server_is_leader 0\n"), "{metrics}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a leader without its peers:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, _) = curl_get(&format!("{url}/health"));
    assert_eq!(code, 503);
    let (_, metrics) = curl_get(&format!("{url}/metrics"));
    let failures = metrics
        .lines()
        .find_map(|l| l.strip_prefix("etcd_server_health_failures "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(failures >= Some(2), "{metrics}");
}
