//! The device manager against a device plugin over real Unix sockets: the plugin (served in
//! this process) registers on the manager's `kubelet.sock`, its `ListAndWatch` devices become
//! the resource's capacity and allocatable, an allocation goes through its
//! `GetPreferredAllocation` and `Allocate`, and the checkpoint holds the result.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::FileTypeExt as _;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use skerry_node::checkpoint::device_manager::{
    DEVICE_MANAGER_CHECKPOINT_FILE, DEVICE_PLUGINS_DIR, DeviceManagerCheckpoint,
};
use skerry_node::checkpoint::{Checkpoint as _, CheckpointManager};
use skerry_node::cm::device_manager::{Counts, DeviceManager, plugin};
use skerry_node::deviceplugin::v1beta1 as api;
use skerry_node::testing::device_plugin::{FakeDevicePlugin, device, register};
use tokio_util::sync::CancellationToken;

const WIDGET: &str = "skerry.test/widget";
/// How long a test waits for what a stream brings.
const WAIT: Duration = Duration::from_secs(10);

fn pod(uid: &str, n: u32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "app", "image": "busybox",
            "resources": {"limits": {WIDGET: n.to_string()}}}]}
    }))
    .expect("pod")
}

async fn counts_become(m: &DeviceManager, want: Counts) {
    let mut rx = m.subscribe();
    let got =
        tokio::time::timeout(WAIT, rx.wait_for(|c| c.get(WIDGET).copied() == Some(want))).await;
    assert!(
        got.is_ok(),
        "counts {:?}, want {want:?}",
        m.counts().get(WIDGET)
    );
}

async fn serve(root: &std::path::Path, grace: Duration) -> (Arc<DeviceManager>, CancellationToken) {
    let m = Arc::new(DeviceManager::with_grace(root, grace).expect("manager"));
    let stop = CancellationToken::new();
    tokio::spawn(plugin::serve(m.clone(), stop.clone()));
    let socket = m.socket_path();
    tokio::time::timeout(WAIT, async {
        // A socket, not the stale file the test may have left there.
        while !std::fs::metadata(&socket).is_ok_and(|m| m.file_type().is_socket()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("registration socket");
    (m, stop)
}

#[tokio::test]
async fn a_plugin_registers_lists_allocates_and_goes() {
    let root = tempfile::tempdir().expect("tempdir");
    // A stale socket file from an earlier kubelet is replaced, an old plugin's socket
    // removed (its plugin sees it and registers again).
    let plugins = root.path().join(DEVICE_PLUGINS_DIR);
    std::fs::create_dir_all(&plugins).expect("dir");
    std::fs::write(plugins.join("kubelet.sock"), "").expect("stale");
    std::fs::write(plugins.join("old-plugin.sock"), "").expect("stale");
    let (m, stop) = serve(root.path(), Duration::from_millis(500)).await;
    assert!(!plugins.join("old-plugin.sock").exists());
    let kubelet_sock = m.socket_path();

    // Refused registrations, with upstream's messages.
    let options = api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    };
    let err = register(&kubelet_sock, "v1alpha", "x.sock", WIDGET, options)
        .await
        .expect_err("old version");
    assert_eq!(
        err.message(),
        "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are [\"v1beta1\"]"
    );
    let err = register(
        &kubelet_sock,
        "v1beta1",
        "x.sock",
        "kubernetes.io/widget",
        options,
    )
    .await
    .expect_err("reserved name");
    assert_eq!(
        err.message(),
        "the ResourceName \"kubernetes.io/widget\" is invalid"
    );

    let plugin = FakeDevicePlugin::start(
        m.dir(),
        "widget.sock",
        WIDGET,
        "WIDGET",
        options,
        vec![
            device("w0", true, &[]),
            device("w1", true, &[]),
            device("w2", false, &[]),
        ],
    )
    .expect("plugin");
    plugin.register(&kubelet_sock).await.expect("register");
    counts_become(
        &m,
        Counts {
            capacity: 3,
            allocatable: 2,
        },
    )
    .await;

    // One widget for pod a: the plugin's preferred one (it prefers the last available).
    let a = pod("a", 1);
    let active = HashSet::from(["a".to_string(), "b".to_string()]);
    m.allocate_pod(&a, &active, |_| None)
        .await
        .expect("allocate");
    let calls = plugin.calls();
    assert_eq!(calls.preferred, [vec!["w0".to_string(), "w1".to_string()]]);
    assert_eq!(calls.allocate, [vec!["w1".to_string()]]);
    assert_eq!(m.allocated("a", "app", WIDGET), ["w1"]);
    let opts = m.run_options("a", "app").expect("options");
    assert_eq!(opts.envs, [("WIDGET".to_string(), "w1".to_string())]);
    assert_eq!(opts.devices.len(), 1);
    assert_eq!(opts.devices[0].container_path, "/dev/widget-w1");
    assert_eq!(opts.devices[0].host_path, "/dev/null");

    // Two more for pod b: only one healthy one is free.
    let err = m
        .allocate_pod(&pod("b", 2), &active, |_| None)
        .await
        .expect_err("one free");
    assert_eq!(
        err,
        "requested number of devices unavailable for skerry.test/widget. Requested: 2, Available: 1"
    );
    assert!(m.allocated("b", "app", WIDGET).is_empty());

    // The checkpoint: a's entry with the plugin's answer, a valid checksum.
    let checkpoints =
        CheckpointManager::new(root.path().join(DEVICE_PLUGINS_DIR)).expect("checkpoints");
    let mut cp = DeviceManagerCheckpoint::default();
    checkpoints
        .get(DEVICE_MANAGER_CHECKPOINT_FILE, &mut cp)
        .expect("a checkpoint with a valid checksum");
    cp.verify_checksum().expect("checksum");
    let entries = cp.data.pod_device_entries.clone().expect("entries");
    assert_eq!(
        (
            entries[0].pod_uid.as_str(),
            entries[0].container_name.as_str()
        ),
        ("a", "app")
    );
    assert_eq!(
        entries[0].device_ids,
        BTreeMap::from([(-1, Some(vec!["w1".to_string()]))])
    );
    assert!(entries[0].alloc_resp.is_some());

    // w0 turns unhealthy: allocatable drops.
    plugin.set_devices(vec![
        device("w0", false, &[]),
        device("w1", true, &[]),
        device("w2", false, &[]),
    ]);
    counts_become(
        &m,
        Counts {
            capacity: 3,
            allocatable: 1,
        },
    )
    .await;

    // The plugin goes: its devices are unhealthy, then removed after the grace period.
    plugin.stop();
    counts_become(
        &m,
        Counts {
            capacity: 3,
            allocatable: 0,
        },
    )
    .await;
    counts_become(
        &m,
        Counts {
            capacity: 0,
            allocatable: 0,
        },
    )
    .await;

    // A new plugin registers the resource again: it replaces the endpoint.
    drop(plugin);
    let again = FakeDevicePlugin::start(
        m.dir(),
        "widget2.sock",
        WIDGET,
        "WIDGET",
        api::DevicePluginOptions::default(),
        vec![device("w0", true, &[]), device("w1", true, &[])],
    )
    .expect("plugin");
    again.register(&kubelet_sock).await.expect("register");
    counts_become(
        &m,
        Counts {
            capacity: 2,
            allocatable: 2,
        },
    )
    .await;
    // b gets w0 (w1 is still a's), without a preference call this time.
    m.allocate_pod(&pod("b", 1), &active, |_| None)
        .await
        .expect("allocate");
    assert_eq!(m.allocated("b", "app", WIDGET), ["w0"]);
    assert_eq!(again.calls().allocate, [vec!["w0".to_string()]]);
    assert!(again.calls().preferred.is_empty());

    // a is gone (not active any more): the next allocation forgets its devices.
    m.allocate_pod(&pod("c", 1), &HashSet::from(["b".to_string()]), |_| None)
        .await
        .expect("allocate");
    assert!(m.allocated("a", "app", WIDGET).is_empty());
    assert_eq!(m.allocated("c", "app", WIDGET), ["w1"]);

    // A third plugin registers the resource while the second still runs: it takes over,
    // and the second's updates no longer count.
    let third = FakeDevicePlugin::start(
        m.dir(),
        "widget3.sock",
        WIDGET,
        "WIDGET",
        api::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: false,
        },
        vec![device("z0", true, &[])],
    )
    .expect("plugin");
    third.register(&kubelet_sock).await.expect("register");
    counts_become(
        &m,
        Counts {
            capacity: 1,
            allocatable: 1,
        },
    )
    .await;
    again.set_devices(vec![device("x", true, &[]); 5]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        m.counts()[WIDGET],
        Counts {
            capacity: 1,
            allocatable: 1
        }
    );
    // It asked for PreStartContainer: called with the container's devices before it starts.
    m.allocate_pod(&pod("d", 1), &HashSet::from(["d".to_string()]), |_| None)
        .await
        .expect("allocate");
    m.pre_start("d", "app").await.expect("pre-start");
    assert_eq!(third.calls().allocate, [vec!["z0".to_string()]]);
    assert_eq!(third.calls().pre_start, [vec!["z0".to_string()]]);
    stop.cancel();
}
