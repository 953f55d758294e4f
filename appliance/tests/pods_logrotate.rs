//! Container log rotation for real: the real binary's node with a small
//! `--container-log-max-size` and `--container-log-max-files 4`, a container writing fast, and
//! the log directory watched across several of the kubelet's 10 s rounds: never more than four
//! files, the older rotated ones gzipped, the newest rotated ones plain, and `kubectl logs`
//! still following the current file. The node harness is `common::node`.

mod common;

use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::kube::tail;
use common::node::{IMAGE, Node, missing_prerequisite, running};

const NODE: &str = "logrotate-node";
/// `--container-log-max-files`: four, so that one rotated file is compressed (the newest
/// rotated one never is, and the current file counts).
const MAX_FILES: usize = 4;
/// How long the log gets to be rotated often enough to have compressed files: three or
/// more of the kubelet's 10 s rounds, with room for a loaded machine.
const ROTATION_TIMEOUT: Duration = Duration::from_secs(120);

/// The files of the container's log directory, leftovers of a compression in progress (a
/// `.tmp`, or a plain file whose `.gz` was just renamed in) not counted.
fn log_files(dir: &Path) -> Vec<String> {
    let all: BTreeSet<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    all.iter()
        .filter(|n| !n.ends_with(".tmp") && !all.contains(&format!("{n}.gz")))
        .cloned()
        .collect()
}

/// The container's log directory: `<root-dir>/pods-logs/<ns>_<pod>_<uid>/<container>`.
fn container_log_dir(node: &Node, uid: &str) -> PathBuf {
    node.data()
        .join(format!("agent/kubelet/pods-logs/default_writer_{uid}/main"))
}

/// The number of the last `line N` in `kubectl logs --tail=1`.
fn last_line(node: &Node) -> u64 {
    let out = node.kube.ok(&["logs", "writer", "--tail=1"]);
    out.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no line number in {out:?}"))
}

#[test]
fn fast_logs_are_rotated_compressed_and_pruned() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start_with(
        NODE,
        &[
            "--container-log-max-size",
            "64Ki",
            "--container-log-max-files",
            &MAX_FILES.to_string(),
        ],
    );
    node.import_busybox();
    // About 100 KiB a second: several times the max size per 10 s round.
    let script = "i=0; pad=$(printf '%0100d' 0); while true; do i=$((i+1)); echo \"line $i $pad\"; \
                  if [ $((i % 100)) = 0 ]; then sleep 0.1; fi; done";
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "writer"},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": IMAGE,
                                 "command": ["sh", "-c", script]}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    let p = node.wait_pod("writer", "running", running);
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let dir = container_log_dir(&node, &uid);

    let first = last_line(&node);
    let deadline = Instant::now() + ROTATION_TIMEOUT;
    let mut most = 0;
    let files = loop {
        let files = log_files(&dir);
        most = most.max(files.len());
        assert!(
            files.len() <= MAX_FILES,
            "more than {MAX_FILES} log files: {files:?}"
        );
        if files.iter().any(|f| f.ends_with(".gz")) && files.len() == MAX_FILES {
            break files;
        }
        assert!(
            Instant::now() < deadline,
            "no compressed rotation in {ROTATION_TIMEOUT:?}: {files:?}\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    // The current file, then the rotated ones: a round compresses all but the newest before
    // it rotates, so the two newest are plain (the one it kept and the one it made) and every
    // older one is gzipped.
    assert!(files.contains(&"0.log".to_string()), "{files:?}");
    let rotated: Vec<&String> = files.iter().filter(|f| *f != "0.log").collect();
    let (plain, gz): (Vec<&String>, Vec<&String>) =
        rotated.iter().partition(|f| !f.ends_with(".gz"));
    assert!(!plain.is_empty() && plain.len() <= 2, "{files:?}");
    let newest_gz = gz.iter().max().expect("a gzipped file");
    assert!(
        plain
            .iter()
            .all(|p| p.as_str() > newest_gz.trim_end_matches(".gz")),
        "a plain rotated file is older than a gzipped one: {files:?}"
    );
    for name in plain.iter().chain(gz.iter()) {
        assert!(
            name.starts_with("0.log.") && name.len() >= "0.log.20060102-150405".len(),
            "{name}"
        );
    }
    // A gzipped file holds CRI log lines.
    let mut text = String::new();
    let opened = std::fs::File::open(dir.join(gz[0].as_str()));
    if let Ok(f) = opened {
        flate2::read::GzDecoder::new(f)
            .read_to_string(&mut text)
            .expect("gunzip");
        assert!(
            text.contains(" stdout F line "),
            "{}",
            &text[..text.len().min(200)]
        );
    }
    // `kubectl logs` reads the current file: its last line moves on after the rotations.
    let later = last_line(&node);
    assert!(
        later > first,
        "kubectl logs stuck at line {later} (first {first})"
    );
    assert!(most <= MAX_FILES);
}
