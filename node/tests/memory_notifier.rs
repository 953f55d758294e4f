//! The memory pressure notifier against the real kernel (`skerry_node::eviction::notifier`):
//! a memcg threshold on an eventfd in a memory-limited v1 cgroup this test creates, filled by
//! a child process, and a PSI trigger on a v2 cgroup's `memory.pressure` under a child that
//! thrashes the page cache. Both count the loop's wake-ups.
//!
//! Needs root and a cgroup file system; the v1 test needs a v1 memory hierarchy (hybrid
//! hosts), the PSI test a v2 hierarchy with `memory.pressure` (unified or hybrid). A host
//! without one skips that test with a message; without root the tests skip, except under
//! `CI=true`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skerry_node::cgroups::{CgroupManager, Layout};
use skerry_node::eviction::notifier::{
    KernelEvent, MemoryThresholdNotifier, PsiTrigger, ThresholdValue, Wake, Watch, memcg_threshold,
};

const MIB: u64 = 1 << 20;

fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("the memory notifier tests need root (cgroups)");
    }
    eprintln!("skipping: the memory notifier tests need root (cgroups)");
    false
}

/// A cgroup directory (or several: one per hierarchy) this test made, and a file on tmpfs;
/// on drop the processes in them are killed, the file removed, the directories removed.
struct Scratch {
    dirs: Vec<PathBuf>,
    files: Vec<PathBuf>,
    children: Vec<std::process::Child>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        for d in &self.dirs {
            for _ in 0..50 {
                let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                }
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `script` in `sh` after moving the shell into each of `procs` (cgroup.procs files).
fn spawn_in(procs: &[PathBuf], script: &str) -> std::process::Child {
    let mut joins = String::new();
    for p in procs {
        joins.push_str(&format!("echo $$ > '{}' && ", p.display()));
    }
    Command::new("sh")
        .arg("-c")
        .arg(format!("{joins}{script}"))
        .spawn()
        .expect("sh")
}

#[tokio::test(flavor = "current_thread")]
async fn memcg_threshold_wakes_the_loop_only_when_usage_crosses() {
    if !root_or_skip() {
        return;
    }
    let cgroups = CgroupManager::detect().expect("cgroups");
    let Layout::V1(_) = cgroups.layout() else {
        eprintln!("skipping: no cgroup v1 memory hierarchy (a unified host: see the PSI test)");
        return;
    };
    let name = format!("/skerry-test-memnotify-{}", std::process::id());
    let dir = cgroups.path("memory", &name).expect("memory hierarchy");
    std::fs::create_dir_all(&dir).expect("mkdir cgroup");
    let shm = PathBuf::from(format!(
        "/dev/shm/skerry-test-memnotify-{}",
        std::process::id()
    ));
    let scratch = Scratch {
        dirs: vec![dir.clone()],
        files: vec![shm.clone()],
        children: vec![],
    };
    let limit = 64 * MIB;
    std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).expect("limit");

    // memory.available < 16Mi on a 64 MiB cgroup: usage threshold 48 MiB + inactive_file.
    let threshold = 16 * MIB;
    let interval = Duration::from_secs(1);
    let mut notifier = MemoryThresholdNotifier::new(
        cgroups.clone(),
        1 << 40,
        vec![Watch {
            cgroup: name.clone(),
            allocatable: false,
            hard: true,
            threshold: ThresholdValue::Quantity(threshold),
        }],
        interval,
    );
    let errors = notifier.arm();
    assert!(errors.is_empty(), "{errors:?}");
    let usage = read_u64(&dir.join("memory.usage_in_bytes"));
    let stat = std::fs::read_to_string(dir.join("memory.stat")).expect("memory.stat");
    let inactive = skerry_node::stats::cgroup::parse_flat_keyed(&stat)
        .get("total_inactive_file")
        .copied()
        .unwrap_or(0);
    assert_eq!(
        notifier.thresholds(),
        vec![Some(memcg_threshold(limit, threshold, inactive))],
        "usage {usage}, inactive_file {inactive}"
    );
    let wakeups = notifier.wakeups();
    let wakes: Arc<Mutex<Vec<(Instant, Wake)>>> = Arc::default();
    let log = wakes.clone();
    let task = tokio::spawn(async move {
        loop {
            let w = notifier.next().await;
            log.lock().expect("lock").push((Instant::now(), w));
        }
    });

    // Idle: nothing changes in the cgroup, so only the housekeeping timer wakes the loop
    // (and its re-registrations must not wake it either).
    let idle = Duration::from_millis(3500);
    tokio::time::sleep(idle).await;
    let (kernel, housekeeping) = (wakeups.kernel(), wakeups.housekeeping());
    println!("idle {idle:?}: {kernel} kernel wake-ups, {housekeeping} housekeeping");
    assert_eq!(kernel, 0, "no memory change, no kernel wake-up");
    assert_eq!(housekeeping, 3, "one per interval");
    assert_eq!(
        wakeups.armed(),
        4,
        "armed once, re-armed at each housekeeping pass"
    );

    // Fill: a child in the cgroup writes 56 MiB to tmpfs (shmem, charged to the cgroup and
    // not reclaimable as page cache), crossing the 48 MiB usage threshold.
    let start = Instant::now();
    let mut child = spawn_in(
        &[dir.join("cgroup.procs")],
        &format!(
            "exec dd if=/dev/zero of='{}' bs=1M count=56 2>/dev/null",
            shm.display()
        ),
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("dd");
    assert!(status.success(), "dd in the cgroup: {status}");
    let usage = read_u64(&dir.join("memory.usage_in_bytes"));
    assert!(usage > 48 * MIB, "usage {usage} after the fill");
    let deadline = Instant::now() + Duration::from_secs(5);
    while wakeups.kernel() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let crossed = wakes
        .lock()
        .expect("lock")
        .iter()
        .find(|(_, w)| matches!(w, Wake::Crossed { .. }))
        .cloned();
    let (at, wake) = crossed.expect("the eventfd fired on the way up");
    println!(
        "up: crossed {:?} after the fill started (usage now {} MiB)",
        at - start,
        usage / MIB
    );
    assert_eq!(
        wake,
        Wake::Crossed {
            watch: 0,
            message: "eviction manager: hard memory eviction threshold crossed".into()
        }
    );
    assert_eq!(wakeups.kernel(), 1);

    // Empty: the file goes, usage falls back under the threshold: the re-armed registration
    // fires again (memcg thresholds signal both ways).
    let start = Instant::now();
    std::fs::remove_file(&shm).expect("rm shm file");
    let deadline = Instant::now() + Duration::from_secs(5);
    while wakeups.kernel() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        wakeups.kernel(),
        2,
        "the re-armed threshold fired on the way down"
    );
    println!("down: crossed {:?} after the removal", start.elapsed());

    // Idle again: no kernel wake-up.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(wakeups.kernel(), 2, "quiet again");
    task.abort();
    let _ = task.await;
    drop(scratch);
}

#[tokio::test(flavor = "current_thread")]
async fn psi_trigger_wakes_on_memory_stalls_in_a_v2_cgroup() {
    if !root_or_skip() {
        return;
    }
    let cgroups = CgroupManager::detect().expect("cgroups");
    let pid = std::process::id();
    let name = format!("/skerry-test-psi-{pid}");
    let (v2_root, memory_dir) = match cgroups.layout() {
        Layout::V2(root) => (root.clone(), None),
        Layout::V1(h) => match (h.get(""), cgroups.path("memory", &name)) {
            (Some(unified), Some(memory)) => (unified.clone(), Some(memory)),
            _ => {
                eprintln!("skipping: no v2 hierarchy beside the v1 ones");
                return;
            }
        },
    };
    if !v2_root.join("memory.pressure").exists() {
        eprintln!("skipping: the kernel has no PSI (memory.pressure) on {v2_root:?}");
        return;
    }
    let work = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let big = work.path().join("big");
    let mut scratch = Scratch {
        dirs: vec![],
        files: vec![],
        children: vec![],
    };
    // The memory limit: on v1 (hybrid) in the memory hierarchy, on v2 `memory.max` of the
    // same cgroup the trigger watches.
    let limit = 16 * MIB;
    let v2_dir = v2_root.join(name.trim_start_matches('/'));
    let mut procs = Vec::new();
    match &memory_dir {
        Some(memory) => {
            std::fs::create_dir_all(memory).expect("mkdir v1 memory cgroup");
            scratch.dirs.push(memory.clone());
            std::fs::write(memory.join("memory.limit_in_bytes"), limit.to_string()).expect("limit");
            procs.push(memory.join("cgroup.procs"));
            std::fs::create_dir_all(&v2_dir).expect("mkdir v2 cgroup");
            scratch.dirs.push(v2_dir.clone());
        }
        None => {
            let config = skerry_node::cgroups::ResourceConfig {
                memory: Some(limit as i64),
                ..Default::default()
            };
            cgroups.create(&name, &config).expect("v2 cgroup");
            scratch.dirs.push(v2_dir.clone());
        }
    }
    procs.push(v2_dir.join("cgroup.procs"));
    // 64 MiB on disk, four times the limit: reading it in a loop in the cgroup makes the
    // kernel reclaim and refault page cache all the time (memory stalls). Written with
    // O_DIRECT: page cache this process filled would stay charged to its own memcg, and the
    // child's reads would then find it cached and charge nothing.
    let status = Command::new("dd")
        .args(["if=/dev/urandom", "bs=1M", "count=64", "oflag=direct"])
        .arg(format!("of={}", big.display()))
        .stderr(std::process::Stdio::null())
        .status()
        .expect("dd");
    assert!(status.success());

    // A low stall threshold: the question is whether the kernel wakes the loop through the
    // trigger at all, not how much reclaim this machine's disk cache makes.
    let trigger = PsiTrigger {
        stall: Duration::from_millis(10),
        window: Duration::from_secs(2),
    };
    let event = KernelEvent::psi(&v2_dir, trigger).expect("PSI trigger");
    let before = std::fs::read_to_string(v2_dir.join("memory.pressure")).expect("pressure");
    let before = skerry_node::eviction::notifier::parse_pressure(&before).expect("parses");

    // Idle: nothing runs in the cgroup, the trigger stays quiet.
    let quiet = tokio::time::timeout(Duration::from_secs(3), event.wait()).await;
    assert!(quiet.is_err(), "no stall, no PSI event: {quiet:?}");

    let start = Instant::now();
    scratch.children.push(spawn_in(
        &procs,
        &format!("while :; do cat '{}' > /dev/null; done", big.display()),
    ));
    let fired = tokio::time::timeout(Duration::from_secs(20), event.wait()).await;
    let after = std::fs::read_to_string(v2_dir.join("memory.pressure")).expect("pressure");
    let after = skerry_node::eviction::notifier::parse_pressure(&after).expect("parses");
    println!(
        "PSI: {:?} after the thrashing started; some total {} -> {} µs",
        start.elapsed(),
        before.some.total,
        after.some.total
    );
    assert!(
        matches!(fired, Ok(Ok(_))),
        "the PSI trigger fired under thrashing: {fired:?}"
    );
    assert!(after.some.total > before.some.total, "stalls were counted");
}
