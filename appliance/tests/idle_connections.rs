//! Idle connections against a three-member cluster of real `skerry server` processes: 1,000
//! connections that never say anything to one port of the leader (its peer port and its
//! Kubernetes API port in one test, part of them through a completed TLS handshake; its etcd
//! client port in another), while etcdctl keeps writing through the cluster. Writes must keep
//! committing, and the server must close every idle connection by its deadline plus a margin
//! (the reader sees EOF or a reset), or at once when it is over the cap on connections in
//! their handshake. Also: `skerry server` raises its soft open-file limit to the hard one.
//!
//! Run with `--nocapture` to see the figures: write latency before and during the flood, and
//! when each kind of connection was closed.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::kube::{Cluster, KUBECTL, KilledOnDrop, Member};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use skerry_apiserver::server::{READ_HEADER_TIMEOUT, TLS_HANDSHAKE_TIMEOUT};
use skerry_raft::transport::HELLO_TIMEOUT;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;

/// Idle connections opened to each port, as the issue asks.
const IDLE_PER_PORT: usize = 1_000;
/// Of the API port's idle connections, these first complete a TLS handshake (half offering
/// `h2`, half `http/1.1`) and then say nothing. The rest send nothing at all.
const IDLE_AFTER_TLS: usize = 200;
/// Slack past a deadline for the close to reach the test: the timer fires late on a loaded
/// 2-core machine, and a connection waits in the backlog before the server's clock starts.
const MARGIN: Duration = Duration::from_secs(5);
/// A connection closed this soon was refused at accept (over the cap), not timed out.
const AT_ONCE: Duration = Duration::from_secs(1);
/// Writes timed before the flood, for the baseline.
const WRITES_BEFORE: usize = 10;
/// A bound the client port's first-request deadline must be within, whatever its exact
/// value (it is set where that listener is built): the longest of the binary's bounds, the
/// Kubernetes API's [`READ_HEADER_TIMEOUT`].
const CLIENT_PORT_DEADLINE_BOUND: Duration = READ_HEADER_TIMEOUT;

/// Each test runs three members with their Kubernetes APIs and thousands of sockets: one at
/// a time, so their timings are not each other's noise.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Raises this test process's soft open-file limit to the hard one: it holds a thousand
/// sockets or more at once.
fn raise_own_open_file_limit() {
    let limit = getrlimit(Resource::Nofile);
    if let (Some(soft), Some(hard)) = (limit.current, limit.maximum)
        && soft < hard
    {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        )
        .expect("raise the test's open-file limit");
    }
}

fn etcdctl(endpoint: &str, args: &[&str]) -> std::process::Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoint)
        .arg("--command-timeout=10s")
        .args(args)
        .output()
        .expect("run etcdctl")
}

fn endpoint(m: &Member) -> String {
    format!("127.0.0.1:{}", m.client_port)
}

/// The index of the member every member names as leader.
fn leader(members: &[Member]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut leaders = Vec::new();
        let mut ids = Vec::new();
        for m in members {
            let out = etcdctl(&endpoint(m), &["endpoint", "status", "-w", "json"]);
            let parsed: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
            let status = &parsed[0]["Status"];
            leaders.push(status["leader"].as_u64().unwrap_or(0));
            ids.push(status["header"]["member_id"].as_u64().unwrap_or(0));
        }
        if leaders[0] != 0
            && leaders.iter().all(|l| *l == leaders[0])
            && let Some(at) = ids.iter().position(|id| *id == leaders[0])
        {
            return at;
        }
        assert!(Instant::now() < deadline, "no agreed leader: {leaders:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One timed `etcdctl put`: its latency, or why it failed.
fn timed_put(endpoint: &str, n: usize) -> Result<Duration, String> {
    let started = Instant::now();
    let out = etcdctl(endpoint, &["put", &format!("idle-test/{n}"), "v"]);
    if out.status.success() {
        Ok(started.elapsed())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Writes through `endpoints` in turn until told to stop; returns each write's outcome.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Result<Duration, String>>>,
}

impl Writer {
    fn start(endpoints: Vec<String>) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut outcomes = Vec::new();
            let mut n = 1_000_000;
            while !stopped.load(Ordering::Relaxed) {
                outcomes.push(timed_put(&endpoints[n % endpoints.len()], n));
                n += 1;
            }
            outcomes
        });
        Writer { stop, thread }
    }

    fn finish(self) -> Vec<Result<Duration, String>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the writer thread")
    }
}

fn median_and_max(latencies: &mut [Duration]) -> (Duration, Duration) {
    latencies.sort();
    (
        latencies[latencies.len() / 2],
        latencies.last().copied().unwrap_or_default(),
    )
}

/// How long after `since` the server closed `stream` (EOF or an error), dropping whatever it
/// sends; `None` if it is still open at `since + limit`.
async fn closed_after(
    mut stream: impl AsyncRead + Unpin,
    since: Instant,
    limit: Duration,
) -> Option<Duration> {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at((since + limit).into(), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Some(since.elapsed()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

/// What became of one kind of idle connection.
struct Outcome {
    kind: &'static str,
    deadline: Duration,
    /// For each connection: when it was closed, counted from its last byte of handshake.
    closed: Vec<Option<Duration>>,
}

impl Outcome {
    /// Prints the figures and checks every connection was closed in time.
    fn report_and_check(&self) {
        let limit = self.deadline + MARGIN;
        let mut closed: Vec<Duration> = self.closed.iter().flatten().copied().collect();
        closed.sort();
        let at_once = closed.iter().filter(|c| **c < AT_ONCE).count();
        let timed: Vec<&Duration> = closed.iter().filter(|c| **c >= AT_ONCE).collect();
        eprintln!(
            "{}: {} connections, deadline {:?}: {} closed at once (over the cap), {} closed at \
             {:?}..{:?}, {} still open after {:?}",
            self.kind,
            self.closed.len(),
            self.deadline,
            at_once,
            timed.len(),
            timed.first().copied().unwrap_or(&Duration::ZERO),
            timed.last().copied().unwrap_or(&Duration::ZERO),
            self.closed.len() - closed.len(),
            limit,
        );
        assert_eq!(
            closed.len(),
            self.closed.len(),
            "{}: {} idle connections still open {MARGIN:?} past the {:?} deadline",
            self.kind,
            self.closed.len() - closed.len(),
            self.deadline
        );
    }
}

/// Opens `count` TCP connections to `port` that send nothing, and waits (in tasks) for the
/// server to close each, at most `deadline + MARGIN`.
async fn idle_tcp(
    port: u16,
    count: usize,
    deadline: Duration,
) -> tokio::task::JoinSet<Option<Duration>> {
    let mut waits = tokio::task::JoinSet::new();
    for _ in 0..count {
        let opened = Instant::now();
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("open an idle connection");
        waits.spawn(closed_after(stream, opened, deadline + MARGIN));
    }
    waits
}

/// Opens `count` connections to the API port that complete TLS (trusting the cluster CA in
/// `ca_pem`, no client certificate) and then send nothing.
async fn idle_after_tls(
    port: u16,
    count: usize,
    ca_pem: &[u8],
) -> tokio::task::JoinSet<Option<Duration>> {
    let ca = CertificateDer::from_pem_slice(ca_pem).expect("the cluster CA");
    let roots = skerry_tls::config::roots([ca]).expect("trust the cluster CA");
    let config = skerry_tls::config::client_config(Arc::new(roots), None, &[])
        .expect("a client TLS configuration");
    let mut waits = tokio::task::JoinSet::new();
    for i in 0..count {
        let mut config = config.clone();
        config.alpn_protocols = vec![if i % 2 == 0 {
            b"h2".to_vec()
        } else {
            b"http/1.1".to_vec()
        }];
        let tcp = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("open a TLS connection");
        let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .expect("TLS handshake with the API");
        let handshaken = Instant::now();
        waits.spawn(closed_after(
            stream,
            handshaken,
            READ_HEADER_TIMEOUT + MARGIN,
        ));
    }
    waits
}

async fn collect(mut waits: tokio::task::JoinSet<Option<Duration>>) -> Vec<Option<Duration>> {
    let mut closed = Vec::new();
    while let Some(c) = waits.join_next().await {
        closed.push(c.expect("a wait task"));
    }
    closed
}

/// Writes before the flood (the baseline), then floods the leader with what `flood` opens
/// while a writer keeps writing through the leader and a follower; checks every write
/// committed and reports the latencies. Returns what `flood` found.
fn under_flood<F>(cluster: &Cluster, flood: F) -> Vec<Outcome>
where
    F: FnOnce(&Member, &Cluster) -> Vec<Outcome>,
{
    let at = leader(&cluster.members);
    let flooded = &cluster.members[at];
    let follower = &cluster.members[(at + 1) % cluster.members.len()];
    let endpoints = vec![endpoint(flooded), endpoint(follower)];
    let mut before: Vec<Duration> = (0..WRITES_BEFORE)
        .map(|n| timed_put(&endpoints[n % 2], n).expect("a write before the flood"))
        .collect();
    let writer = Writer::start(endpoints);
    let outcomes = flood(flooded, cluster);
    let during = writer.finish();
    let failed: Vec<&String> = during.iter().filter_map(|o| o.as_ref().err()).collect();
    let mut during: Vec<Duration> = during
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .copied()
        .collect();
    let (before_median, before_max) = median_and_max(&mut before);
    assert!(!during.is_empty(), "no write finished during the flood");
    let (during_median, during_max) = median_and_max(&mut during);
    eprintln!(
        "etcdctl put (a process per write, through the leader and a follower): before the \
         flood median {before_median:?} max {before_max:?} ({} writes); during it median \
         {during_median:?} max {during_max:?} ({} writes, {} failed)",
        before.len(),
        during.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "writes failed during the flood: {failed:?}"
    );
    outcomes
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[test]
fn idle_connections_to_the_peer_and_api_ports_are_closed_by_their_deadlines_while_writes_commit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_own_open_file_limit();
    let cluster = Cluster::start();
    let ca_pem = std::fs::read(cluster.root.path().join("pki").join("ca.crt")).expect("CA");
    let outcomes = under_flood(&cluster, |flooded, cluster| {
        runtime().block_on(async {
            let after_tls = idle_after_tls(flooded.api_port, IDLE_AFTER_TLS, &ca_pem).await;
            let api = idle_tcp(
                flooded.api_port,
                IDLE_PER_PORT - IDLE_AFTER_TLS,
                TLS_HANDSHAKE_TIMEOUT,
            )
            .await;
            let peer = idle_tcp(flooded.peer_port, IDLE_PER_PORT, HELLO_TIMEOUT).await;
            // The flooded API still admits a client (the flood is under its cap) and answers.
            let kubectl = Command::new(KUBECTL)
                .args(["get", "--raw", "/readyz"])
                .env("KUBECONFIG", &flooded.kubeconfig)
                .env("HOME", &cluster.home)
                .stdin(Stdio::null())
                .output()
                .expect("run kubectl");
            assert!(
                kubectl.status.success(),
                "kubectl through the flooded API: {}",
                String::from_utf8_lossy(&kubectl.stderr)
            );
            vec![
                Outcome {
                    kind: "peer port, silent TCP",
                    deadline: HELLO_TIMEOUT,
                    closed: collect(peer).await,
                },
                Outcome {
                    kind: "API port, silent TCP",
                    deadline: TLS_HANDSHAKE_TIMEOUT,
                    closed: collect(api).await,
                },
                Outcome {
                    kind: "API port, silent after TLS",
                    deadline: READ_HEADER_TIMEOUT,
                    closed: collect(after_tls).await,
                },
            ]
        })
    });
    for outcome in &outcomes {
        outcome.report_and_check();
    }
}

/// The etcd client port's part: its accept path is bounded where that listener is built;
/// until it is, the idle connections stay open and this test fails.
#[test]
fn idle_connections_to_the_client_port_are_closed_by_its_deadline_while_writes_commit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_own_open_file_limit();
    let cluster = Cluster::start();
    let outcomes = under_flood(&cluster, |flooded, _| {
        runtime().block_on(async {
            let client = idle_tcp(
                flooded.client_port,
                IDLE_PER_PORT,
                CLIENT_PORT_DEADLINE_BOUND,
            )
            .await;
            vec![Outcome {
                kind: "client port, silent TCP",
                deadline: CLIENT_PORT_DEADLINE_BOUND,
                closed: collect(client).await,
            }]
        })
    });
    for outcome in &outcomes {
        outcome.report_and_check();
    }
}

/// `skerry server` started with a soft open-file limit under its hard one runs with the hard
/// one (as a Go program would).
#[test]
fn skerry_server_raises_its_soft_open_file_limit_to_the_hard_one() {
    let hard = getrlimit(Resource::Nofile)
        .maximum
        .expect("a finite hard open-file limit");
    let soft = hard / 2;
    let dir = tempfile::tempdir().expect("tempdir");
    let port = common::free_port();
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -Sn {soft} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_skerry"))
        .args(["server", "--secure-port=0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--listen-client-urls")
        .arg(format!("http://127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start skerry under a lowered soft limit");
    let child = KilledOnDrop(child);
    // The limit is raised before anything binds: once the client port answers, it is done.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "skerry did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.0.id()))
        .expect("read the server's limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("an open-files line");
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(
        numbers,
        [hard.to_string(), hard.to_string()],
        "started with soft {soft}: {line}"
    );
}
