//! A box without the packages a node needs: `skerry server` as root with no containerd or
//! runc on its PATH still serves the control plane, prints one line naming the Debian packages
//! to install, and registers its Node NotReady with that reason (and keeps it there), so the
//! cluster sees the box and knows why it runs nothing. The server is the real binary; its
//! PATH is an empty directory, which hides every runtime binary from it.

mod common;

use std::time::{Duration, Instant};

use common::kube::{Kube, tail};
use common::node::missing;
use serde_json::Value;

const NODE: &str = "bare-box";
/// How long the Node gets to appear after the API is up.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn a_box_without_containerd_serves_and_reports_its_node_not_ready_with_the_packages() {
    if missing(
        "this test needs root (a non-root server runs no node agent at all)",
        rustix::process::geteuid().is_root(),
    ) {
        return;
    }
    let empty = tempfile::tempdir().expect("tempdir");
    let path = empty.path().display().to_string();
    let kube = Kube::start_with_agent(&["--hostname-override", NODE], &[("PATH", path.as_str())]);
    let deadline = Instant::now() + REGISTER_TIMEOUT;
    let ready = loop {
        let out = kube.kubectl_output(&["get", "node", NODE, "-o", "json"], None);
        if out.status.success() {
            let node: Value = serde_json::from_slice(&out.stdout).expect("node JSON");
            let ready = node["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned());
            if let Some(ready) = ready {
                break ready;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no Node {NODE} with a Ready condition in {REGISTER_TIMEOUT:?}\n{}",
            tail(&kube.log())
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(ready["status"], "False", "{ready}");
    assert_eq!(ready["reason"], "KubeletNotReady", "{ready}");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("container runtime is down: ")
            && message.contains("apt-get install containerd runc"),
        "the Ready condition names the packages: {message}"
    );

    // One line on the server's output says the same.
    let log = kube.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("skerry: this node runs no pods"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one line names the packages:\n{}",
        tail(&log)
    );
    assert!(lines[0].contains("containerd runc"), "{}", lines[0]);

    // The control plane serves.
    kube.ok(&["create", "namespace", "bare"]);
    assert!(kube.ok(&["get", "namespaces"]).contains("bare"));
    let node = kube.ok(&["get", "node", NODE]);
    assert!(node.contains("NotReady"), "{node}");
}
