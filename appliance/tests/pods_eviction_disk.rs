//! The eviction manager under real disk pressure (issue 19: "a node under disk pressure
//! removes unused images before it evicts anything"): the real binary with its containerd and
//! runc, on a disk of its own. The node's data dir (the store, the kubelet's root dir with the
//! pods' emptyDirs and logs, containerd's root with its content store and overlayfs snapshots)
//! is a [`DISK`]-sized tmpfs mounted before the server starts, so `nodefs` and `imagefs` are that
//! file system's `statvfs` and the test can push them past the thresholds without filling the
//! machine's disk (overlayfs with a tmpfs upper dir is what containerd 1.6 runs on here).
//!
//! Two images no pod uses ([`BALLAST`], incompressible contents) take room on it; two pods run
//! busybox: `writer` (requests 10Mi of ephemeral storage) and `bystander` (requests 64Mi, writes
//! 16Mi). The test writes into the writer's emptyDir (`kubectl exec dd`) until `nodefs.available`
//! is [`OVERSHOOT`] below the threshold: the manager removes the unused images (CRI
//! `ListImages` no longer has them; the pause image and busybox, which pods use, stay), that is
//! enough, and no pod is evicted. Written past the threshold again, with no image left to remove,
//! the pod using the most disk beyond its request (the writer) is evicted: Failed, reason
//! Evicted, upstream's ephemeral-storage message; the node reports DiskPressure and the node
//! lifecycle controller taints it `node.kubernetes.io/disk-pressure`, and
//! `kubelet_evictions` counts one eviction on a disk signal. The harness is `common::node`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::node::{
    IMAGE, Node, client_cert, cri_images, curl_kubelet, missing_prerequisite, running,
};
use serde_json::Value;
use skerry_node::images::build::{ImageBuilder, PAUSE_IMAGE};

const NODE: &str = "disk-eviction-node";
/// The node's disk: room for containerd, the pause and busybox images, the two ballast images
/// and the writes, with the thresholds well inside it.
const DISK: u64 = 320 << 20;
/// `--eviction-hard nodefs.available<...,imagefs.available<...` (the same file system).
const THRESHOLD_MIB: u64 = 120;
/// How far below the threshold a write takes `nodefs.available`: well past the statvfs noise
/// of containerd's and the kubelet's own writes, and far less than the ballast frees.
const OVERSHOOT_MIB: u64 = 16;
/// The unused images and the size of each one's incompressible file: stored twice (the
/// content store's gzip blob and the unpacked snapshot), they free about 4 x this.
const BALLAST: [&str; 2] = ["skerry.test/ballast-a:1", "skerry.test/ballast-b:1"];
/// See [`BALLAST`].
const BALLAST_MIB: usize = 24;
/// How long the manager may take to act: its 10 s monitoring interval (disk has no kernel
/// notification), the stats' own lag and a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(90);
/// How long the test watches that nothing is evicted after the images went: three passes.
const QUIET: Duration = Duration::from_secs(30);

fn available_mib(dir: &Path) -> u64 {
    let st = rustix::fs::statvfs(dir).expect("statvfs");
    st.f_bavail * st.f_frsize / (1 << 20)
}

/// An image with one file of `mib` MiB of pseudo-random (incompressible) bytes.
fn ballast(name: &str, mib: usize, seed: u64) -> ImageBuilder {
    let mut data = vec![0u8; mib << 20];
    let mut x = seed | 1;
    for chunk in data.chunks_exact_mut(8) {
        // xorshift64: fast in a debug build, and gzip cannot shrink it.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    let mut image = ImageBuilder::new(name).expect("image name");
    image.file("/ballast", data, 0o644);
    image
}

fn pod(name: &str, request: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "containers": [{"name": "c", "image": IMAGE,
                "resources": {"requests": {"ephemeral-storage": request}},
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                "command": ["sleep", "3600"]}]}})
}

/// `kubectl exec` of `dd` writing `mib` MiB into the pod's emptyDir as file `file`.
fn write(node: &Node, pod: &str, file: &str, mib: u64) {
    // Through sh: the image links busybox's `dd` only as sh's own applet.
    node.kube.ok(&[
        "exec",
        pod,
        "--",
        "sh",
        "-c",
        &format!("dd if=/dev/zero of=/scratch/{file} bs=1048576 count={mib}"),
    ]);
}

fn node_json(node: &Node) -> Value {
    serde_json::from_str(&node.kube.ok(&["get", "node", &node.name, "-o", "json"]))
        .expect("node JSON")
}

fn condition(node: &Node, type_: &str) -> String {
    node_json(node)["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn wait(what: &str, node: &Node, ok: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !ok() {
        assert!(
            started.elapsed() < TIMEOUT,
            "{what} not seen in {TIMEOUT:?}\n{}",
            common::kube::tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    started.elapsed()
}

fn tags(socket: &Path) -> Vec<String> {
    cri_images(socket)
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect()
}

#[test]
fn unused_images_go_before_any_pod_then_the_pod_over_its_request() {
    if missing_prerequisite() {
        return;
    }
    let hard = format!(
        "memory.available<100Mi,nodefs.available<{THRESHOLD_MIB}Mi,imagefs.available<{THRESHOLD_MIB}Mi"
    );
    // The whole data dir: the store refuses a data dir holding anything but its own files
    // when it creates itself, so the tmpfs is the (empty) data dir and the store lives on it
    // too (a few MiB, measured with the rest).
    // The ballast is imported after the kubelet's start-up image detection, so image GC
    // first sees it at the crossing: under the default minimum age (2 minutes) it would be
    // too young to remove, and the writer would be evicted instead, as upstream's kubelet
    // does. The minimum age is covered by `skerry_node::images::gc`'s tests; here it is 0.
    let node = Node::start_prepared(
        NODE,
        &[
            "--eviction-hard",
            &hard,
            "--minimum-image-ttl-duration",
            "0",
        ],
        |data| {
            let out = Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={DISK},mode=0755"),
                    "tmpfs",
                ])
                .arg(data)
                .output()
                .expect("mount");
            assert!(
                out.status.success(),
                "mount tmpfs: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        },
    );
    let disk = node.data();
    node.import_busybox();
    for (i, name) in BALLAST.iter().enumerate() {
        node.import(&ballast(
            name,
            BALLAST_MIB,
            0x9e37_79b9_7f4a_7c15 + i as u64,
        ));
    }
    let before = tags(&node.socket());
    for name in BALLAST.iter().chain([&IMAGE, &PAUSE_IMAGE]) {
        assert!(before.iter().any(|t| t == name), "{name} in {before:?}");
    }
    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(&pod("bystander", "64Mi").to_string()),
    );
    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(&pod("writer", "10Mi").to_string()),
    );
    node.wait_pod("bystander", "Running", running);
    node.wait_pod("writer", "Running", running);
    write(&node, "bystander", "within", 16);

    // Past the threshold by OVERSHOOT: removing the ballast frees enough.
    let available = available_mib(&disk);
    println!("after the images and the pods: {available} MiB available of {DISK} bytes");
    assert!(
        available > THRESHOLD_MIB + OVERSHOOT_MIB,
        "the disk is already short: {available} MiB"
    );
    write(
        &node,
        "writer",
        "one",
        available - THRESHOLD_MIB + OVERSHOOT_MIB,
    );
    let crossed = available_mib(&disk);
    println!("written: {crossed} MiB available, threshold {THRESHOLD_MIB} MiB");
    let took = wait("the unused images removed", &node, || {
        let now = tags(&node.socket());
        BALLAST.iter().all(|b| !now.contains(&b.to_string()))
    });
    let after = tags(&node.socket());
    println!("images removed {took:?} after the crossing; left: {after:?}");
    // The images pods use stay: busybox (both pods' containers) and the pause image.
    assert!(after.iter().any(|t| t == IMAGE), "{after:?}");
    assert!(after.iter().any(|t| t == PAUSE_IMAGE), "{after:?}");
    let reclaimed = available_mib(&disk);
    assert!(
        reclaimed > THRESHOLD_MIB,
        "the images freed too little: {reclaimed} MiB available"
    );
    // That was enough: nothing is evicted over the next passes.
    let quiet = Instant::now();
    while quiet.elapsed() < QUIET {
        for name in ["writer", "bystander"] {
            let p = node.pod(name);
            assert_eq!(p["status"]["phase"], "Running", "{name}: {:#}", p["status"]);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        node.kube
            .log()
            .contains("able to reduce resource pressure without evicting pods"),
        "{}",
        common::kube::tail(&node.kube.log())
    );

    // Past it again with nothing left to remove: the pod furthest beyond its request goes.
    let available = available_mib(&disk);
    write(
        &node,
        "writer",
        "two",
        available - THRESHOLD_MIB + OVERSHOOT_MIB,
    );
    println!(
        "written again: {} MiB available",
        available_mib(&disk).min(available)
    );
    let started = Instant::now();
    let evicted = node.wait_pod("writer", "evicted", |p| {
        p["status"]["phase"] == "Failed" && p["status"]["reason"] == "Evicted"
    });
    println!(
        "writer evicted {:?} after the second write",
        started.elapsed()
    );
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    // Upstream names a container only when its own writable layer and logs exceed its
    // request; the writer's disk is its emptyDir, which counts for the pod's ranking.
    assert!(
        message.starts_with(&format!(
            "The node was low on resource: ephemeral-storage. Threshold quantity: {THRESHOLD_MIB}Mi, available: "
        )),
        "{message}"
    );
    let bystander = node.pod("bystander");
    assert_eq!(
        bystander["status"]["phase"], "Running",
        "{:#}",
        bystander["status"]
    );
    wait("DiskPressure=True", &node, || {
        condition(&node, "DiskPressure") == "True"
    });
    wait("the disk-pressure taint", &node, || {
        node_json(&node)["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["key"] == "node.kubernetes.io/disk-pressure" && t["effect"] == "NoSchedule")
    });
    let admin = client_cert(&node, &node.kube.kubeconfig, "admin");
    let (code, metrics) = curl_kubelet(&node, "/metrics", Some(&admin));
    assert_eq!(code, "200", "{metrics}");
    let disk_evictions: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("kubelet_evictions"))
        .filter(|l| l.contains("nodefs.available") || l.contains("imagefs.available"))
        .collect();
    assert!(
        disk_evictions.iter().any(|l| l.ends_with(" 1")),
        "{disk_evictions:?}"
    );
    let events = common::node::events(&node, "writer");
    assert!(
        events.iter().any(|e| e.starts_with("Evicted: ")),
        "{events:?}"
    );
}
