use super::*;
use crate::checkpoint::Checkpoint as _;
use crate::checkpoint::device_manager::{DEVICE_MANAGER_CHECKPOINT_FILE, DeviceManagerCheckpoint};

const WIDGET: &str = "skerry.test/widget";

fn pod(uid: &str, init: &[(&str, u32)], apps: &[(&str, u32)]) -> Pod {
    let c = |(name, n): &(&str, u32)| {
        serde_json::json!({"name": name, "image": "busybox",
            "resources": {"limits": {WIDGET: n.to_string()}, "requests": {WIDGET: n.to_string()}}})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {
            "initContainers": init.iter().map(c).collect::<Vec<_>>(),
            "containers": apps.iter().map(c).collect::<Vec<_>>(),
        }
    }))
    .expect("pod")
}

/// A manager with `devices` registered for [`WIDGET`] by a plugin that is never dialled.
fn manager(dir: &std::path::Path, devices: &[api::Device]) -> Arc<DeviceManager> {
    let m = Arc::new(DeviceManager::new(dir).expect("manager"));
    let channel = crate::cri::transport::unix_channel(&dir.join("absent.sock"));
    let generation = m.connected(
        WIDGET,
        Endpoint {
            client: api::device_plugin_client::DevicePluginClient::new(channel),
            options: api::DevicePluginOptions::default(),
        },
        tokio_util::sync::CancellationToken::new(),
    );
    m.update_devices(WIDGET, generation, devices);
    m
}

fn dev(id: &str, healthy: bool, numa: &[i64]) -> api::Device {
    crate::testing::device_plugin::device(id, healthy, numa)
}

fn hold(m: &DeviceManager, uid: &str, container: &str, ids: &[&str]) {
    m.inner
        .lock()
        .pods
        .entry(uid.into())
        .or_default()
        .entry(container.into())
        .or_default()
        .insert(
            WIDGET.into(),
            Allocation {
                ids: ids.iter().map(|s| s.to_string()).collect(),
                resp: Some(api::ContainerAllocateResponse {
                    envs: [("WIDGET".to_string(), ids.join(","))].into(),
                    ..Default::default()
                }),
            },
        );
}

#[test]
fn extended_resource_names_as_upstream_checks_them() {
    for ok in [
        "skerry.test/widget",
        "nvidia.com/gpu",
        "example.com/a_b.c-d",
    ] {
        assert!(is_extended_resource_name(ok), "{ok}");
    }
    for bad in [
        "widget",
        "cpu",
        "kubernetes.io/widget",
        "sub.kubernetes.io/widget",
        "requests.example.com/x",
        "example.com/",
        "example.com/-bad",
        "Example_Com/x",
    ] {
        assert!(!is_extended_resource_name(bad), "{bad}");
    }
    let req = |version: &str, name: &str| api::RegisterRequest {
        version: version.into(),
        endpoint: "w.sock".into(),
        resource_name: name.into(),
        options: None,
    };
    assert_eq!(
        plugin::validate(&req("v1alpha", WIDGET)).expect_err("old version"),
        "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are [\"v1beta1\"]"
    );
    assert_eq!(
        plugin::validate(&req("v1beta1", "kubernetes.io/widget")).expect_err("reserved"),
        "the ResourceName \"kubernetes.io/widget\" is invalid"
    );
    assert!(plugin::validate(&req("v1beta1", WIDGET)).is_ok());
    let mut outside = req("v1beta1", WIDGET);
    outside.endpoint = "../x.sock".into();
    assert!(plugin::validate(&outside).is_err());
}

#[tokio::test]
async fn only_healthy_free_devices_are_picked_and_release_frees_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(
        dir.path(),
        &[
            dev("w0", true, &[]),
            dev("w1", true, &[]),
            dev("w2", false, &[]),
            dev("w3", true, &[]),
        ],
    );
    assert_eq!(
        m.counts()[WIDGET],
        Counts {
            capacity: 4,
            allocatable: 3
        }
    );
    let a = pod("a", &[], &[("app", 1)]);
    hold(&m, "other", "app", &["w0"]);
    let free = DeviceManager::free_devices(&m.inner.lock(), &a, "a", WIDGET);
    assert_eq!(
        free,
        ["w1", "w3"],
        "not the unhealthy w2 nor w0 held by another pod"
    );
    // An init container's devices are reused by the pod's next containers, first.
    let b = pod("b", &[("init", 1)], &[("app", 1)]);
    hold(&m, "b", "init", &["w3"]);
    let free = DeviceManager::free_devices(&m.inner.lock(), &b, "b", WIDGET);
    assert_eq!(free, ["w3", "w1"]);
    // ...but never by another pod.
    let free = DeviceManager::free_devices(&m.inner.lock(), &a, "a", WIDGET);
    assert_eq!(free, ["w1"]);
    m.release("b");
    m.release("other");
    let free = DeviceManager::free_devices(&m.inner.lock(), &a, "a", WIDGET);
    assert_eq!(free, ["w0", "w1", "w3"]);
    // Not enough: upstream's message, nothing kept.
    let big = pod("big", &[], &[("app", 4)]);
    let err = m
        .allocate_pod(&big, &HashSet::from(["big".to_string()]), |_| None)
        .await
        .expect_err("3 healthy devices");
    assert_eq!(
        err,
        "requested number of devices unavailable for skerry.test/widget. Requested: 4, Available: 3"
    );
    assert!(m.inner.lock().pods.is_empty());
}

#[test]
fn numa_hints_and_the_affinity_pick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let m = manager(
        dir.path(),
        &[
            dev("a0", true, &[0]),
            dev("a1", true, &[0]),
            dev("b0", true, &[1]),
            dev("b1", true, &[1]),
        ],
    );
    let p = pod("p", &[], &[("app", 2)]);
    let c = &p.spec.as_ref().expect("spec").containers[0];
    let hints = m.container_hints(&p, c)[WIDGET].clone().expect("hints");
    let masks: Vec<(Vec<u32>, bool)> = hints
        .iter()
        .map(|h| (h.affinity.expect("mask").bits(), h.preferred))
        .collect();
    assert_eq!(
        masks,
        [(vec![0], true), (vec![1], true), (vec![0, 1], false)]
    );
    // One device of NUMA 0 held elsewhere: only node 1 still fits alone.
    hold(&m, "other", "app", &["a0"]);
    let hints = m.container_hints(&p, c)[WIDGET].clone().expect("hints");
    let masks: Vec<Vec<u32>> = hints
        .iter()
        .map(|h| h.affinity.expect("mask").bits())
        .collect();
    assert_eq!(masks, [vec![1], vec![0, 1]]);
    let free = DeviceManager::free_devices(&m.inner.lock(), &p, "p", WIDGET);
    let mask = BitMask::new(&[1]).expect("mask");
    assert_eq!(
        DeviceManager::pick(&m.inner.lock(), WIDGET, &free, 2, Some(mask)),
        ["b0", "b1"]
    );
    // Devices without topology: no preference.
    let plain = manager(dir.path(), &[dev("p0", true, &[]), dev("p1", true, &[])]);
    assert_eq!(plain.container_hints(&p, c).get(WIDGET), Some(&None));
    // A container asking nothing of the plugin has no preference.
    let none: Pod = serde_json::from_value(
        serde_json::json!({"metadata": {"uid": "n"}, "spec": {"containers": [{"name": "c"}]}}),
    )
    .expect("pod");
    assert!(
        m.container_hints(&none, &none.spec.as_ref().expect("spec").containers[0])
            .is_empty()
    );
}

#[tokio::test]
async fn allocations_survive_a_restart_through_the_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path(), &[dev("w0", true, &[1]), dev("w1", true, &[])]);
    hold(&m, "a", "app", &["w0", "w1"]);
    m.write_checkpoint();
    let file = dir
        .path()
        .join(DEVICE_PLUGINS_DIR)
        .join(DEVICE_MANAGER_CHECKPOINT_FILE);
    let mut cp = DeviceManagerCheckpoint::default();
    cp.unmarshal(&std::fs::read(&file).expect("checkpoint"))
        .expect("json");
    cp.verify_checksum().expect("checksum");
    let entries = cp.data.pod_device_entries.clone().expect("entries");
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].device_ids,
        BTreeMap::from([
            (-1, Some(vec!["w1".to_string()])),
            (1, Some(vec!["w0".to_string()]))
        ])
    );
    assert_eq!(
        cp.data.registered_devices[WIDGET],
        Some(vec!["w0".to_string(), "w1".to_string()])
    );
    drop(m);
    // A new kubelet: the container keeps its devices and its plugin's answer; the resource
    // is at zero until the plugin registers again.
    let again = DeviceManager::new(dir.path()).expect("manager");
    assert_eq!(again.allocated("a", "app", WIDGET), ["w0", "w1"]);
    let opts = again.run_options("a", "app").expect("options");
    assert_eq!(opts.envs, [("WIDGET".to_string(), "w0,w1".to_string())]);
    assert_eq!(again.counts()[WIDGET], Counts::default());
    // A restart of its container asks the plugin nothing (it is not even there).
    let a = pod("a", &[], &[("app", 2)]);
    again
        .allocate_pod(&a, &HashSet::from(["a".to_string()]), |_| None)
        .await
        .expect("kept");
    assert_eq!(again.allocated("a", "app", WIDGET), ["w0", "w1"]);
    // The plugin comes back with one more device: only that one is free for another pod.
    let again = Arc::new(again);
    let channel = crate::cri::transport::unix_channel(&dir.path().join("absent.sock"));
    let generation = again.connected(
        WIDGET,
        Endpoint {
            client: api::device_plugin_client::DevicePluginClient::new(channel),
            options: api::DevicePluginOptions::default(),
        },
        tokio_util::sync::CancellationToken::new(),
    );
    again.update_devices(
        WIDGET,
        generation,
        &[
            dev("w0", true, &[1]),
            dev("w1", true, &[]),
            dev("w2", true, &[]),
        ],
    );
    let b = pod("b", &[], &[("app", 1)]);
    assert_eq!(
        DeviceManager::free_devices(&again.inner.lock(), &b, "b", WIDGET),
        ["w2"]
    );
    // The pod ends: its entry leaves the checkpoint.
    again.release("a");
    let mut cp = DeviceManagerCheckpoint::default();
    cp.unmarshal(&std::fs::read(&file).expect("checkpoint"))
        .expect("json");
    cp.verify_checksum().expect("checksum");
    assert_eq!(cp.data.pod_device_entries, None);
}

#[test]
fn an_upstream_checkpoint_restores_and_a_corrupt_one_starts_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join(DEVICE_PLUGINS_DIR);
    std::fs::create_dir_all(&plugins).expect("dir");
    let upstream = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#;
    let file = plugins.join(DEVICE_MANAGER_CHECKPOINT_FILE);
    std::fs::write(&file, upstream).expect("write");
    let m = DeviceManager::new(dir.path()).expect("manager");
    let uid = "bf52b2cd-b611-4e79-86b1-280b283185c3";
    assert_eq!(m.allocated(uid, "check", "nvidia.com/gpu"), ["tegra"]);
    assert_eq!(
        m.run_options(uid, "check").expect("options").envs,
        [("NVIDIA_VISIBLE_DEVICES".to_string(), "tegra".to_string())]
    );
    assert!(m.counts().contains_key("nvidia.com/gpu"));
    std::fs::write(
        &file,
        upstream.replace("\"tegra\"]},\"Alloc", "\"tegrb\"]},\"Alloc"),
    )
    .expect("write");
    let m = DeviceManager::new(dir.path()).expect("manager");
    assert!(m.inner.lock().pods.is_empty());
    assert!(m.counts().is_empty());
}

/// The kubelet's resource managers with the device manager as the topology manager's third
/// provider: a request the devices cannot hold refuses the pod as upstream does, and frees
/// what it took.
#[tokio::test]
async fn too_few_devices_are_an_unexpected_admission_error() {
    use crate::cm::topology::{Policy, Scope, TopologyManager, machine::Machine};
    let dir = tempfile::tempdir().expect("tempdir");
    let devices = manager(dir.path(), &[dev("a0", true, &[0]), dev("b0", true, &[1])]);
    let machine = Machine::from_table(&[(0, 0, 0, 0), (1, 1, 1, 1)], 1 << 30);
    let checkpoints = CheckpointManager::new(dir.path().to_path_buf()).expect("checkpoints");
    let cpu = Arc::new(
        crate::cm::cpu_manager::CpuManager::new("none", None, machine, checkpoints)
            .expect("cpu manager"),
    );
    let providers: Vec<Arc<dyn HintProvider>> = vec![cpu.clone(), devices.clone()];
    let topology =
        TopologyManager::new(Policy::BestEffort, Scope::Container, vec![0, 1], providers)
            .expect("topology");
    let managers = crate::cm::ResourceManagers {
        cpu,
        memory: None,
        devices: devices.clone(),
        topology,
        reconcile_period: Duration::from_secs(10),
    };
    let big = pod("big", &[], &[("app", 3)]);
    managers.admit(&big).expect("best-effort admits");
    let err = managers
        .allocate_devices(&big, &HashSet::from(["big".to_string()]))
        .await
        .expect_err("two devices");
    assert_eq!(err.reason, "UnexpectedAdmissionError");
    assert_eq!(
        err.message,
        "Allocate failed due to requested number of devices unavailable for skerry.test/widget. Requested: 3, Available: 2, which is unexpected"
    );
    assert!(
        managers.topology.affinity("big", "app").is_none(),
        "released"
    );
    // One device: the topology manager merged NUMA node 0 or 1 alone for it.
    let one = pod("one", &[], &[("app", 1)]);
    managers.admit(&one).expect("admit");
    let hint = managers.topology.affinity("one", "app").expect("affinity");
    assert_eq!(hint.affinity.map(|m| m.count()), Some(1));
    assert!(hint.preferred);
}
