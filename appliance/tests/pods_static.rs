//! Static pods with the real binary, kubectl and containerd: manifests dropped into
//! `<data-dir>/agent/pod-manifests` run, and their mirror pods show them in the API.
//!
//! One node, one story: a manifest runs and its mirror is Running in `kubectl get pods`;
//! broken manifests beside it are logged and run nothing; a deleted mirror comes back while
//! the container keeps running; an edit replaces the pod; removing the file stops the pod and
//! deletes the mirror. The apiserver's side: a mirror pod naming a service account is
//! refused, as upstream's ServiceAccount admission refuses it.

mod common;

use skerry_node::cri::api;
use std::time::{Duration, Instant};

use common::kube::tail;
use common::node::{IMAGE, Node, POD_TIMEOUT, cri_containers, missing_prerequisite, running};
use serde_json::Value;

const NODE: &str = "static-node";
/// The mirror of `web.yaml`'s pod `web`: the node's name appended.
const MIRROR: &str = "web-static-node";

/// The manifest of pod `web` running `sleep <seconds>` on the host network; a short grace
/// period, since `sleep` as PID 1 ignores SIGTERM.
fn web(seconds: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels:\n    app: web\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: sleeper\n    image: {IMAGE}\n    command: [sleep, \"{seconds}\"]\n"
    )
}

fn annotation<'a>(pod: &'a Value, key: &str) -> &'a str {
    pod["metadata"]["annotations"][key]
        .as_str()
        .unwrap_or_default()
}

fn container_id(pod: &Value) -> String {
    pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn wait_until(node: &Node, what: &str, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + POD_TIMEOUT;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what} not in {POD_TIMEOUT:?}\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn static_pods_run_from_the_manifest_folder_with_their_mirrors() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    let manifests = node.data().join("agent/pod-manifests");
    wait_until(&node, "the manifest folder created", || manifests.is_dir());

    // Broken manifests beside the good one: bad YAML, two documents, another kind, an
    // invalid pod. Each is logged with its file and why; none runs.
    let broken = [
        ("bad-yaml.yaml", "kind: [".to_string()),
        ("two.yaml", format!("{}---\n{}", web(1), web(2))),
        (
            "kind.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n".to_string(),
        ),
        (
            "invalid.json",
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad"},"spec":{"containers":[]}}"#
                .to_string(),
        ),
    ];
    for (file, text) in &broken {
        std::fs::write(manifests.join(file), text).expect("write");
    }
    // Neither hidden files nor other extensions are manifests.
    std::fs::write(manifests.join(".web.yaml.swp"), web(5)).expect("write");
    std::fs::write(manifests.join("README"), "not a pod").expect("write");
    let dropped = Instant::now();
    std::fs::write(manifests.join("web.yaml"), web(3600)).expect("write");

    // The good one runs, and its mirror is Running in `kubectl get pods`.
    let mirror = node.wait_pod(MIRROR, "Running", running);
    eprintln!(
        "manifest written to mirror Running: {:?}",
        dropped.elapsed()
    );
    let hash = annotation(&mirror, "kubernetes.io/config.hash").to_string();
    assert_eq!(hash.len(), 32, "{mirror}");
    assert_eq!(annotation(&mirror, "kubernetes.io/config.mirror"), hash);
    assert_eq!(annotation(&mirror, "kubernetes.io/config.source"), "file");
    assert!(!annotation(&mirror, "kubernetes.io/config.seen").is_empty());
    assert_ne!(
        mirror["metadata"]["uid"],
        hash.as_str(),
        "the API gives the mirror its own UID"
    );
    assert_eq!(mirror["metadata"]["namespace"], "default");
    assert_eq!(mirror["spec"]["nodeName"], NODE);
    let owner = &mirror["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["name"], NODE);
    assert_eq!(owner["controller"], true);
    let node_uid = node
        .kube
        .ok(&["get", "node", NODE, "-o", "jsonpath={.metadata.uid}"]);
    assert_eq!(owner["uid"], node_uid.trim());
    assert!(
        mirror["spec"]["tolerations"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["operator"] == "Exists"
                && t["effect"] == "NoExecute"
                && t.get("key").is_none()),
        "{mirror}"
    );
    let table = node.kube.ok(&["get", "pods", "--no-headers"]);
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 1, "only the good manifest runs: {table}");
    assert!(
        rows[0].starts_with(MIRROR) && rows[0].contains("Running"),
        "{table}"
    );
    let log = node.kube.log();
    for (file, _) in &broken {
        assert!(
            log.lines()
                .any(|l| l.contains(file) && l.contains("the manifest is not run")),
            "{file} is not logged:\n{}",
            tail(&log)
        );
    }
    assert!(
        log.contains("more than one YAML document"),
        "{}",
        tail(&log)
    );
    assert!(log.contains("not a v1 Pod"), "{}", tail(&log));
    assert!(
        log.contains("invalid pod: [spec.containers"),
        "{}",
        tail(&log)
    );
    let container = container_id(&mirror);
    assert!(container.starts_with("containerd://"), "{mirror}");
    assert_eq!(cri_containers(&node.socket(), &hash).len(), 1);
    let mirror_uid = mirror["metadata"]["uid"].as_str().unwrap_or_default();
    assert!(
        cri_containers(&node.socket(), mirror_uid).is_empty(),
        "the mirror pod itself is never run"
    );

    // Deleting the mirror brings it back; the container keeps running.
    let first_mirror_uid = mirror["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let deleted = Instant::now();
    // Not waited for by kubectl: the kubelet deletes the mirror and creates its successor in
    // one sync, and kubectl's wait (a GET, then a LIST and WATCH by name) can miss the
    // deletion when the successor is already listed; the UID below is the check.
    node.kube.ok(&["delete", "pod", MIRROR, "--wait=false"]);
    let again = node.wait_pod(MIRROR, "recreated and Running", |p| {
        p["metadata"]["uid"] != first_mirror_uid.as_str()
            && running(p)
            && !container_id(p).is_empty()
    });
    eprintln!(
        "kubectl delete of the mirror to its successor Running: {:?}",
        deleted.elapsed()
    );
    assert_eq!(annotation(&again, "kubernetes.io/config.mirror"), hash);
    assert_eq!(
        container_id(&again),
        container,
        "the container was not restarted"
    );
    assert_eq!(again["status"]["containerStatuses"][0]["restartCount"], 0);
    let cs = cri_containers(&node.socket(), &hash);
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0].state, api::ContainerState::ContainerRunning as i32);

    // Editing the manifest replaces the pod: a new hash, a new container, the old one gone.
    let edited_at = Instant::now();
    std::fs::write(manifests.join("web.yaml"), web(3601)).expect("write");
    let edited = node.wait_pod(MIRROR, "replaced and Running", |p| {
        annotation(p, "kubernetes.io/config.mirror") != hash
            && running(p)
            && !container_id(p).is_empty()
    });
    eprintln!(
        "manifest edited to the new pod Running: {:?}",
        edited_at.elapsed()
    );
    let new_hash = annotation(&edited, "kubernetes.io/config.hash").to_string();
    assert_eq!(annotation(&edited, "kubernetes.io/config.mirror"), new_hash);
    assert_ne!(container_id(&edited), container);
    assert_eq!(
        edited["spec"]["containers"][0]["command"],
        serde_json::json!(["sleep", "3601"])
    );
    wait_until(&node, "the old pod's containers removed", || {
        cri_containers(&node.socket(), &hash).is_empty()
    });

    // Removing the manifest stops the pod and deletes its mirror.
    let removed_at = Instant::now();
    std::fs::remove_file(manifests.join("web.yaml")).expect("remove");
    wait_until(&node, "the mirror deleted", || {
        !node
            .kube
            .kubectl_output(&["get", "pod", MIRROR], None)
            .status
            .success()
    });
    wait_until(&node, "the pod's containers removed", || {
        cri_containers(&node.socket(), &new_hash).is_empty()
    });
    eprintln!(
        "manifest removed to mirror and containers gone: {:?}",
        removed_at.elapsed()
    );

    // The apiserver: a mirror pod may not name a service account.
    let refused = node.kube.fails(
        &["create", "-f", "-"],
        Some(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"fake-mirror","annotations":{"kubernetes.io/config.mirror":"x"}},"spec":{"serviceAccountName":"default","containers":[{"name":"c","image":"i"}]}}"#,
        ),
    );
    assert!(
        refused.contains(
            r#"pods "fake-mirror" is forbidden: a mirror pod may not reference service accounts"#
        ),
        "{refused}"
    );
}
