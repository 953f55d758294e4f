//! The eviction benchmark (issue 19, "Measure"): one `skerry server` with its node agent (its
//! own containerd) whose `kubepods` is a small cgroup ([`KUBEPODS`], the rest of the machine
//! `--system-reserved`), and two figures:
//!
//! (a) the eviction manager's reaction time, from the instant memory crosses the hard threshold
//!     to the eviction decision, over several rounds (median, p90). Each round runs a pod that
//!     fills a memory-backed emptyDir below the threshold, waits, then fills past it. The
//!     benchmark reads the `kubepods` cgroup every millisecond (working set = usage minus
//!     inactive file, as the kubelet counts it) and stamps the first sample past the threshold
//!     (`allocatableMemory.available`, the hard `memory.available` threshold copied onto the
//!     pods' cgroup); the decision is the time stamp of the kubelet's log line `eviction
//!     manager: evicting pod` (same host clock), which also carries `reaction_ms`, the pass's
//!     own time from its start to the decision. Without the memory threshold notifier the pass
//!     would start on the 10 s monitoring interval: a crossing at a random instant waits 5 s on
//!     average and up to 10 s; the round says which wake-up started the pass.
//! (b) the kubelet at rest: `--pods` pods (30) running `sleep`, and over [`IDLE_WINDOW`] the
//!     `skerry` process's CPU (`utime+stime`, the control plane included, as
//!     `skerry-podstartup` measures it) and the eviction manager's and the notifier's wake-ups,
//!     counted from their debug log lines (`--log-level info,skerry_node::eviction=debug`).
//!
//! Run (as root, containerd, runc, catatonit and busybox-static installed):
//!
//! ```text
//! cargo build --release -p skerry -p skerry-tests --bin skerry --bin skerry-evictionbench
//! sudo target/release/skerry-evictionbench --skerry target/release/skerry
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use skerry_tests::nodebench::{IMAGE, Server, now_ns, percentile};

const NODE: &str = "evictionbench-node";
/// What `kubepods` may hold: the filler's pages fit below it, so the kernel's OOM killer never
/// acts before the eviction manager.
const KUBEPODS: u64 = 600 << 20;
/// The hard `memory.available` threshold: crossed when the pods' working set passes
/// KUBEPODS minus this (350 MiB).
const THRESHOLD: u64 = 250 << 20;
/// The filler's first write, below the threshold with the node's own pods' pages.
const FILL_BELOW_MIB: u64 = 280;
/// The second write, which crosses it.
const FILL_CROSS_MIB: u64 = 120;
/// How long a round may take before the benchmark gives up.
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);
/// The window over which the kubelet at rest is measured.
const IDLE_WINDOW: Duration = Duration::from_secs(60);
/// How often the cgroup is sampled for the crossing.
const SAMPLE: Duration = Duration::from_millis(1);

#[derive(Parser)]
struct Args {
    /// The `skerry` binary measured (a release build).
    #[arg(long, default_value = "target/release/skerry")]
    skerry: PathBuf,
    /// Eviction rounds.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Pods at rest for the CPU figure.
    #[arg(long, default_value_t = 30)]
    pods: usize,
}

/// The server's log, without the terminal colours tracing writes.
fn server_log(server: &Server) -> String {
    let raw = std::fs::read_to_string(server.dir.path().join("server.log")).unwrap_or_default();
    strip_ansi(&raw)
}

/// A pod's phase and reason, `None` if it cannot be read.
fn pod_phase(server: &Server, name: &str) -> Option<(String, String)> {
    let out = server
        .kubectl(&["get", "pod", name, "-o", "json"], None)
        .ok()?;
    let p: Value = serde_json::from_str(&out).ok()?;
    Some((
        p["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        p["status"]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    ))
}

/// The log without the terminal colours tracing writes.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A log line's leading RFC 3339 UTC stamp (`2026-12-02T10:11:12.123456Z`) in ns.
fn stamp_ns(line: &str) -> Option<u128> {
    let t = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = t.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut h = hms.split(':').map(|x| x.parse::<i64>());
    let (hh, mm, ss) = (h.next()?.ok()?, h.next()?.ok()?, h.next()?.ok()?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    let frac_ns: u128 = format!("{frac:0<9}")[..9].parse().ok()?;
    Some(u128::try_from(secs).ok()? * 1_000_000_000 + frac_ns)
}

fn mem_total() -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("MemTotal")?;
    Ok(kib * 1024)
}

/// The pods' cgroup's working set: usage minus inactive file (v1 `memory.usage_in_bytes` and
/// `total_inactive_file`, v2 `memory.current` and `inactive_file`).
fn working_set(cgroup_root: &str) -> Option<u64> {
    let v1 = format!("/sys/fs/cgroup/memory{cgroup_root}/kubepods");
    let v2 = format!("/sys/fs/cgroup{cgroup_root}/kubepods");
    let (usage, stat, key) = if Path::new(&v1).exists() {
        (
            std::fs::read_to_string(format!("{v1}/memory.usage_in_bytes")).ok()?,
            std::fs::read_to_string(format!("{v1}/memory.stat")).ok()?,
            "total_inactive_file ",
        )
    } else {
        (
            std::fs::read_to_string(format!("{v2}/memory.current")).ok()?,
            std::fs::read_to_string(format!("{v2}/memory.stat")).ok()?,
            "inactive_file ",
        )
    };
    let usage: u64 = usage.trim().parse().ok()?;
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

/// The benchmark's server: a `kubepods` of [`KUBEPODS`] (the rest of the machine reserved),
/// the threshold [`THRESHOLD`], and the eviction manager's wake-ups logged.
fn start(skerry: &Path) -> Result<Server> {
    let flags = [
        "--system-reserved".to_string(),
        format!("memory={}Ki", (mem_total()? - KUBEPODS) / 1024),
        // The build machine's disk is often past the default nodefs floor.
        format!(
            "--eviction-hard=memory.available<{}Mi,nodefs.available<1%,imagefs.available<1%",
            THRESHOLD >> 20
        ),
        "--eviction-pressure-transition-period".to_string(),
        "5s".to_string(),
        "--log-level".to_string(),
        "info,skerry_node::eviction=debug".to_string(),
    ];
    Server::start(skerry, "evbench", NODE, &flags)
}

fn wait_until(what: &str, ok: impl Fn() -> bool) -> Result<()> {
    let deadline = Instant::now() + ROUND_TIMEOUT;
    while !ok() {
        if Instant::now() > deadline {
            bail!("{what} not seen in {ROUND_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// One eviction round: (reaction in ms from the crossing to the decision line, the pass's
/// own `reaction_ms`, what woke the pass).
fn eviction_round(server: &Server, i: usize) -> Result<(f64, f64, String)> {
    let name = format!("hog-{i}");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "500Mi"}}],
            "containers": [{"name": "fill", "image": IMAGE,
                "resources": {"requests": {"memory": "10Mi"}},
                "volumeMounts": [{"name": "ram", "mountPath": "/ram"}],
                "command": ["sh", "-c", format!(
                    "dd if=/dev/zero of=/ram/a bs=1048576 count={FILL_BELOW_MIB}; sleep 3; \
                     dd if=/dev/zero of=/ram/b bs=1048576 count={FILL_CROSS_MIB}; exec sleep 3600")]}]}});
    server.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()))?;
    wait_until("the filler Running", || {
        pod_phase(server, &name).is_some_and(|(p, _)| p == "Running")
    })?;
    let limit = KUBEPODS - THRESHOLD;
    let deadline = Instant::now() + ROUND_TIMEOUT;
    let crossed = loop {
        if working_set(&server.cgroup_root).is_some_and(|ws| ws > limit) {
            break now_ns();
        }
        if Instant::now() > deadline {
            bail!("{name}: the working set never passed {limit} bytes");
        }
        std::thread::sleep(SAMPLE);
    };
    let key = format!("/{name} ");
    wait_until("the eviction decision", || {
        server_log(server)
            .lines()
            .any(|l| l.contains("eviction manager: evicting pod") && l.contains(&key))
    })?;
    let log = server_log(server);
    let lines: Vec<&str> = log.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("eviction manager: evicting pod") && l.contains(&key))
        .context("decision line")?;
    let line = lines[at];
    let decided = stamp_ns(line).context("the decision line's time stamp")?;
    let pass_ms: f64 = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("reaction_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    let woke = lines[..at]
        .iter()
        .rev()
        .find_map(|l| {
            l.contains("eviction manager: woke").then(|| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix("reason="))
                    .unwrap_or("?")
                    .trim_matches('"')
                    .to_string()
            })
        })
        .unwrap_or_else(|| "?".into());
    let reaction = (decided as f64 - crossed as f64) / 1e6;
    wait_until("the filler Failed", || {
        pod_phase(server, &name).is_some_and(|(p, _)| p == "Failed")
    })?;
    server.kubectl(&["delete", "pod", &name, "--wait=true"], None)?;
    // The next round starts once the emptyDir's pages are gone.
    wait_until("the pods' memory released", || {
        working_set(&server.cgroup_root).is_some_and(|ws| ws < 64 << 20)
    })?;
    std::thread::sleep(Duration::from_secs(2));
    Ok((reaction, pass_ms, woke))
}

/// CPU ticks (`utime+stime`) of a process.
fn ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

/// The wake-up lines in the log, by kind.
fn wakeups(log: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for l in log.lines() {
        let kind = if l.contains("eviction manager: woke") {
            "eviction manager"
        } else if l.contains("memory threshold notifier: woke") {
            "notifier housekeeping"
        } else if l.contains("eviction manager: ") && l.ends_with(" crossed") {
            "notifier kernel"
        } else {
            continue;
        };
        let reason = l
            .split_whitespace()
            .find_map(|f| f.strip_prefix("reason="))
            .unwrap_or("")
            .trim_matches('"');
        *out.entry(format!("{kind} {reason}").trim().to_string())
            .or_insert(0) += 1;
    }
    out
}

fn at_rest(server: &Server, n: usize) -> Result<()> {
    let items: Vec<Value> = (0..n)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("rest-{i}"), "labels": {"round": "rest"}},
                "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "3600"]}]}})
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    server.kubectl(&["apply", "-f", "-"], Some(&list.to_string()))?;
    wait_until("the pods Running", || {
        server
            .kubectl(
                &[
                    "get",
                    "pods",
                    "-l",
                    "round=rest",
                    "-o",
                    "jsonpath={.items[*].status.phase}",
                ],
                None,
            )
            .is_ok_and(|o| o.split_whitespace().filter(|p| *p == "Running").count() == n)
    })?;
    // Let the start-up's work (status updates, the first stats) settle.
    std::thread::sleep(Duration::from_secs(15));
    let pid = server.child.id() as i32;
    let before_log = server_log(server);
    let before = ticks(pid);
    std::thread::sleep(IDLE_WINDOW);
    let after = ticks(pid);
    let log = server_log(server);
    let window = log.get(before_log.len()..).unwrap_or_default();
    // CLK_TCK is 100 on Linux.
    let cpu = (after - before) as f64 / IDLE_WINDOW.as_secs_f64();
    println!(
        "at rest, {n} pods over {IDLE_WINDOW:?}: skerry CPU {cpu:.2} % of a core ({} ticks)",
        after - before
    );
    for (kind, count) in wakeups(window) {
        println!("  wake-ups: {kind:<36} {count}");
    }
    server.kubectl(&["delete", "pods", "-l", "round=rest", "--wait=true"], None)?;
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let server = start(&args.skerry)?;
    println!("server log: {}/server.log", server.dir.path().display());
    at_rest(&server, args.pods)?;
    wait_until("the pods' memory released", || {
        working_set(&server.cgroup_root).is_some_and(|ws| ws < 64 << 20)
    })?;
    let mut reactions = Vec::new();
    for i in 0..args.rounds {
        let (reaction, pass, woke) = eviction_round(&server, i)?;
        println!(
            "round {i}: crossing -> decision {reaction:.1} ms (the pass itself {pass:.0} ms; woken: {woke})"
        );
        reactions.push(reaction);
    }
    reactions.sort_by(|a, b| a.total_cmp(b));
    println!(
        "reaction over {} rounds: median {:.1} ms, p90 {:.1} ms, min {:.1} ms, max {:.1} ms",
        reactions.len(),
        percentile(&reactions, 50.0),
        percentile(&reactions, 90.0),
        reactions.first().copied().unwrap_or(f64::NAN),
        reactions.last().copied().unwrap_or(f64::NAN)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_stamps_parse() {
        assert_eq!(
            stamp_ns("1970-01-01T00:00:01.5Z  INFO x"),
            Some(1_500_000_000)
        );
        assert_eq!(
            stamp_ns("2026-12-02T10:11:12.123456Z  INFO x"),
            Some(1_796_206_272_123_456_000)
        );
        assert_eq!(strip_ansi("\x1b[2mA\x1b[0m B"), "A B");
    }
}
