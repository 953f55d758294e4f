//! The real Python `kubernetes` client (Debian's python3-kubernetes, run with
//! `/usr/bin/python3`) against a running `skerry server`: each test starts the binary on a
//! fresh data dir, writes a short script that loads the admin kubeconfig skerry writes with
//! `kubernetes.config.load_kube_config`, runs it, and checks the JSON it prints.

mod common;

use std::process::Command;

use common::kube::*;
use serde_json::Value;

/// The interpreter whose `kubernetes` package is Debian's python3-kubernetes.
const PYTHON: &str = "/usr/bin/python3";

/// Runs `script` with the admin kubeconfig as its first argument (and `args` after it); it
/// must succeed and print one JSON document.
fn python(k: &Kube, script: &str, args: &[&str]) -> Value {
    let path = k.path("script.py");
    std::fs::write(&path, script).expect("write the script");
    let out = Command::new(PYTHON)
        .arg(&path)
        .arg(&k.kubeconfig)
        .args(args)
        .env("HOME", &k.home)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python failed:\nstdout: {stdout}\nstderr: {}\nserver log tail:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&k.log())
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// Watches ConfigMaps with `watch.Watch().stream(...)` (which sends `watch=True`) and, from
/// inside the loop, creates, patches and deletes one: each change must come back as an event
/// of the watch that is already open. Prints `[[type, name, data.k], ...]`.
const WATCH_SCRIPT: &str = r#"
import json, sys
from kubernetes import client, config, watch
config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
ns = "default"
v1.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="seed")))
seen = []
w = watch.Watch()
for ev in w.stream(v1.list_namespaced_config_map, ns, timeout_seconds=60):
    name = ev["object"].metadata.name
    seen.append([ev["type"], name, (ev["object"].data or {}).get("k")])
    if ev["type"] == "ADDED" and name == "seed":
        v1.create_namespaced_config_map(
            ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm1"), data={"k": "1"}))
    elif ev["type"] == "ADDED" and name == "cm1":
        v1.patch_namespaced_config_map("cm1", ns, {"data": {"k": "2"}})
    elif ev["type"] == "MODIFIED" and name == "cm1":
        v1.delete_namespaced_config_map("cm1", ns)
    elif ev["type"] == "DELETED" and name == "cm1":
        w.stop()
print(json.dumps(seen))
"#;

#[test]
fn python_watch_receives_added_modified_and_deleted() {
    let k = Kube::start(&[]);
    let seen = python(&k, WATCH_SCRIPT, &[]);
    assert_eq!(
        seen,
        serde_json::json!([
            ["ADDED", "seed", null],
            ["ADDED", "cm1", "1"],
            ["MODIFIED", "cm1", "2"],
            ["DELETED", "cm1", "2"],
        ])
    );
}
