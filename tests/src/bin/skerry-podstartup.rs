//! The pod start-up benchmark: one `skerry server` with its node agent (its own containerd),
//! N pods (30 by default) created at once on that one node with the image already present,
//! once on the host network and once on the pod network; from creation to Running as a watch
//! sees it, p50 / p99 against the Kubernetes pod start-up SLO (p99 <= 5 s for stateless pods
//! with the image present: `sig-scalability/slos/pod_startup_latency.md`), where the time
//! goes, and skerry's own RSS and CPU with the pods running, containerd and its shims apart.
//!
//! Where the time goes comes from two clocks of the same host: the watch's (`kubectl get -w`,
//! the instant each event arrives) and containerd's (CRI `created_at` of the sandbox,
//! `created_at` / `started_at` of the container, nanoseconds): created -> scheduled (watch
//! sees `spec.nodeName`) -> sandbox (the kubelet's `RunPodSandbox` until containerd stamps
//! the sandbox; with the pod network it includes the CNI plugins) -> create (sandbox stamp
//! until the container's `created_at`) -> start (until `started_at`) -> status (until the
//! watch sees phase Running: PLEG, status manager, API write, watch).
//!
//! Run (as root, containerd, runc, catatonit, busybox-static and the CNI plugins installed):
//!
//! ```text
//! cargo build --release -p skerry -p skerry-tests --bin skerry --bin skerry-podstartup
//! sudo target/release/skerry-podstartup --skerry target/release/skerry
//! ```

use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use skerry_tests::nodebench::{IMAGE, KUBECTL, Server, now_ns, percentile};

const NODE: &str = "bench-node";
/// How long one round may take before the benchmark gives up: 30 pods on 2 cores take
/// seconds; a minute means something is stuck.
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the CPU of the processes is sampled with the pods running.
const CPU_WINDOW: Duration = Duration::from_secs(10);
/// The SLO: p99 of pod start-up <= 5 s.
const SLO_P99: Duration = Duration::from_secs(5);

#[derive(Parser)]
struct Args {
    /// The `skerry` binary measured (a release build).
    #[arg(long, default_value = "target/release/skerry")]
    skerry: PathBuf,
    /// Pods per round.
    #[arg(long, default_value_t = 30)]
    pods: usize,
}

/// One pod's moments, in nanoseconds since the epoch.
#[derive(Default, Debug, Clone)]
struct Moments {
    added: Option<u128>,
    scheduled: Option<u128>,
    running: Option<u128>,
    sandbox: Option<u128>,
    created: Option<u128>,
    started: Option<u128>,
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect()
}

fn cmdline(pid: i32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
        .replace('\0', " ")
}

/// The benchmark's server: default flags but a 1 % disk eviction floor.
fn start(skerry: &Path) -> Result<Server> {
    // The build machine's disk is often past the default nodefs floor.
    let flags = [
        "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%".into(),
    ];
    Server::start(skerry, "podbench", NODE, &flags)
}

/// One round: `n` pods created by one `kubectl apply`, watched until all are Running.
fn round(server: &Server, prefix: &str, host_network: bool, n: usize) -> Result<Vec<Moments>> {
    let moments: Arc<Mutex<BTreeMap<String, Moments>>> = Arc::default();
    let mut watch = Command::new(KUBECTL)
        .args([
            "get",
            "pods",
            "-w",
            "--output-watch-events",
            "-o",
            "json",
            "-l",
            &format!("round={prefix}"),
        ])
        .env("KUBECONFIG", server.data().join("admin.kubeconfig"))
        .env("HOME", server.dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = watch.stdout.take().context("watch stdout")?;
    let seen = moments.clone();
    let reader = std::thread::spawn(move || {
        let events = serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter();
        for event in events.flatten() {
            let event: Value = event;
            let t = now_ns();
            let pod = &event["object"];
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            let mut all = seen.lock().expect("not poisoned");
            let m = all.entry(name.to_string()).or_default();
            m.added.get_or_insert(t);
            if pod["spec"]["nodeName"].is_string() {
                m.scheduled.get_or_insert(t);
            }
            if pod["status"]["phase"] == "Running" {
                m.running.get_or_insert(t);
            }
        }
    });
    // Let the watch start before the pods exist.
    std::thread::sleep(Duration::from_secs(1));
    let items: Vec<Value> = (0..n)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{prefix}-{i}"), "labels": {"round": prefix}},
                "spec": {"hostNetwork": host_network, "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "3600"]}]}})
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    server.kubectl(&["apply", "-f", "-"], Some(&list.to_string()))?;
    let deadline = Instant::now() + ROUND_TIMEOUT;
    loop {
        let done = moments
            .lock()
            .expect("not poisoned")
            .values()
            .filter(|m| m.running.is_some())
            .count();
        if done == n {
            break;
        }
        if Instant::now() > deadline {
            let _ = watch.kill();
            bail!("{done}/{n} pods Running after {ROUND_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let _ = reader.join();
    let mut all = moments.lock().expect("not poisoned").clone();
    cri_moments(&server.socket(), &mut all)?;
    Ok(all.into_values().collect())
}

/// containerd's stamps of each pod's sandbox and container.
fn cri_moments(socket: &Path, all: &mut BTreeMap<String, Moments>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let cri = skerry_node::cri::Cri::new(&socket.display().to_string())?;
        for s in cri.list_pod_sandbox(None).await? {
            let name = s
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            if let Some(m) = all.get_mut(&name) {
                m.sandbox = Some(s.created_at as u128);
            }
        }
        for c in cri.list_containers(None).await? {
            let name = c
                .labels
                .get("io.kubernetes.pod.name")
                .cloned()
                .unwrap_or_default();
            let status = cri.container_status(&c.id, false).await?;
            if let (Some(m), Some(st)) = (all.get_mut(&name), status.status) {
                m.created = Some(st.created_at as u128);
                m.started = Some(st.started_at as u128);
            }
        }
        anyhow::Ok(())
    })
}

/// One phase of a pod's start-up, in milliseconds.
type Span = dyn Fn(&Moments) -> Option<f64>;

fn span(from: Option<u128>, to: Option<u128>) -> Option<f64> {
    let (a, b) = (from?, to?);
    Some((b as f64 - a as f64) / 1e6)
}

fn report(label: &str, ms: &[Moments]) {
    let stat = |f: &Span| {
        let mut v: Vec<f64> = ms.iter().filter_map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        (percentile(&v, 50.0), percentile(&v, 99.0))
    };
    let (p50, p99) = stat(&|m| span(m.added, m.running));
    let verdict = if p99 <= SLO_P99.as_millis() as f64 {
        "within"
    } else {
        "OVER"
    };
    println!(
        "{label}: {} pods, creation -> Running (watch): p50 {p50:.0} ms, p99 {p99:.0} ms ({verdict} the 5 s SLO)",
        ms.len()
    );
    let phases: [(&str, &Span); 5] = [
        ("scheduled", &|m| span(m.added, m.scheduled)),
        ("sandbox", &|m| span(m.scheduled, m.sandbox)),
        ("create", &|m| span(m.sandbox, m.created)),
        ("start", &|m| span(m.created, m.started)),
        ("status", &|m| span(m.started, m.running)),
    ];
    for (name, f) in phases {
        let (p50, p99) = stat(f);
        println!("  {name:<10} p50 {p50:>7.0} ms   p99 {p99:>7.0} ms");
    }
}

/// RSS (kB) and CPU ticks of a process.
fn usage(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    (rss, ticks)
}

fn resources(server: &Server) {
    let socket = server.socket().display().to_string();
    let skerry = server.child.id() as i32;
    let data = server.data().display().to_string();
    let comm = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    // containerd runs with its config under the data dir; the shims name its socket.
    let containerd: Vec<i32> = pids()
        .into_iter()
        .filter(|p| comm(*p) == "containerd" && cmdline(*p).contains(&data))
        .collect();
    let shims: Vec<i32> = pids()
        .into_iter()
        .filter(|p| comm(*p).starts_with("containerd-shim") && cmdline(*p).contains(&socket))
        .collect();
    let groups = [
        ("skerry", vec![skerry]),
        ("containerd", containerd),
        ("shims", shims),
    ];
    let before: Vec<Vec<(u64, u64)>> = groups
        .iter()
        .map(|(_, ps)| ps.iter().map(|p| usage(*p)).collect())
        .collect();
    std::thread::sleep(CPU_WINDOW);
    // CLK_TCK is 100 on Linux.
    for ((name, ps), b) in groups.iter().zip(before) {
        let after: Vec<(u64, u64)> = ps.iter().map(|p| usage(*p)).collect();
        let rss: u64 = after.iter().map(|u| u.0).sum();
        let ticks: u64 = after
            .iter()
            .zip(&b)
            .map(|(a, b)| a.1.saturating_sub(b.1))
            .sum();
        let cpu = ticks as f64 / CPU_WINDOW.as_secs_f64();
        println!(
            "  {name:<10} {} process(es), RSS {:.1} MiB, CPU {cpu:.1} % of a core over {CPU_WINDOW:?}",
            ps.len(),
            rss as f64 / 1024.0
        );
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let server = start(&args.skerry)?;
    let host = round(&server, "host", true, args.pods)?;
    report("host network", &host);
    println!("with {} pods running:", args.pods);
    resources(&server);
    server.kubectl(&["delete", "pods", "-l", "round=host", "--wait=true"], None)?;
    let pod = round(&server, "podnet", false, args.pods)?;
    report("pod network", &pod);
    println!("with {} pods running:", args.pods);
    resources(&server);
    server.kubectl(
        &["delete", "pods", "-l", "round=podnet", "--wait=true"],
        None,
    )?;
    Ok(())
}
