//! The device manager for real: the real binary's node agent serves the device plugin
//! registration socket under its kubelet root dir; a device plugin (served in this test's
//! process, `skerry_node::testing::device_plugin`) registers `skerry.test/widget` with two
//! devices, the Node shows them as capacity and allocatable, a pod with
//! `limits: {skerry.test/widget: 1}` is scheduled and admitted, the plugin's `Allocate` is
//! called, and its container sees the plugin's environment variable and device node (real
//! containerd and runc); the `kubelet_internal_checkpoint` holds the pod's entry with a valid
//! checksum. The harness is `common::node`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::kube::tail;
use common::node::{IMAGE, Node, POD_TIMEOUT, missing_prerequisite, running};
use serde_json::Value;
use skerry_node::checkpoint::device_manager::{
    DEVICE_MANAGER_CHECKPOINT_FILE, DEVICE_PLUGINS_DIR, DeviceManagerCheckpoint,
};
use skerry_node::checkpoint::{Checkpoint as _, CheckpointManager};
use skerry_node::deviceplugin::v1beta1 as api;
use skerry_node::testing::device_plugin::{FakeDevicePlugin, device};

const NODE: &str = "devices-node";
const WIDGET: &str = "skerry.test/widget";
/// The kubelet's root dir under the data dir (`appliance/src/node.rs` `KUBELET_DIR`).
const KUBELET_DIR: &str = "agent/kubelet";

fn wait_for(what: &str, node: &Node, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + POD_TIMEOUT;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what} not reached\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn node_json(node: &Node) -> Value {
    serde_json::from_str(&node.kube.ok(&["get", "node", &node.name, "-o", "json"]))
        .expect("node JSON")
}

#[test]
fn a_device_plugin_s_widget_reaches_a_pod() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    let dir = node.data().join(KUBELET_DIR).join(DEVICE_PLUGINS_DIR);
    let kubelet_sock = dir.join("kubelet.sock");
    wait_for("the registration socket", &node, || kubelet_sock.exists());

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let plugin = {
        let _in = rt.enter();
        FakeDevicePlugin::start(
            &dir,
            "widget.sock",
            WIDGET,
            "WIDGET",
            api::DevicePluginOptions::default(),
            vec![device("w0", true, &[]), device("w1", true, &[])],
        )
        .expect("plugin")
    };
    rt.block_on(plugin.register(&kubelet_sock))
        .expect("register");
    wait_for("the widgets on the Node", &node, || {
        let n = node_json(&node);
        n["status"]["capacity"][WIDGET] == "2" && n["status"]["allocatable"][WIDGET] == "2"
    });

    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "widget-user"},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": IMAGE,
                    "command": ["sh", "-c",
                        "echo WIDGET=$WIDGET; test -c /dev/widget-$WIDGET && echo device-node-present; sleep 3600"],
                    "resources": {"limits": {WIDGET: "1"}}}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    let p = node.wait_pod("widget-user", "running", running);
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();

    let calls = plugin.calls();
    assert_eq!(calls.allocate.len(), 1, "{calls:?}");
    let id = calls.allocate[0][0].clone();
    let want = format!("WIDGET={id}\ndevice-node-present");
    wait_for("the container's output", &node, || {
        let out = node.kube.kubectl_output(&["logs", "widget-user"], None);
        String::from_utf8_lossy(&out.stdout).contains(&want)
    });

    let checkpoints = CheckpointManager::new(dir.clone()).expect("checkpoints");
    let mut cp = DeviceManagerCheckpoint::default();
    checkpoints
        .get(DEVICE_MANAGER_CHECKPOINT_FILE, &mut cp)
        .expect("a checkpoint with a valid checksum");
    cp.verify_checksum().expect("checksum");
    let entries = cp.data.pod_device_entries.clone().unwrap_or_default();
    let entry = entries
        .iter()
        .find(|e| e.pod_uid == uid)
        .unwrap_or_else(|| panic!("no entry of {uid}: {entries:?}"));
    assert_eq!(
        (entry.container_name.as_str(), entry.resource_name.as_str()),
        ("c", WIDGET)
    );
    assert_eq!(
        entry
            .device_ids
            .values()
            .flatten()
            .flatten()
            .collect::<Vec<_>>(),
        [&id]
    );
    assert!(Path::new(&dir.join(DEVICE_MANAGER_CHECKPOINT_FILE)).exists());
    node.kube
        .ok(&["delete", "pod", "widget-user", "--wait=false"]);
    drop(plugin);
    drop(rt);
}
