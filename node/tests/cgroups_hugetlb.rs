//! Hugepage limits in real cgroups: a pod asking for `hugepages-2Mi` gets its pod cgroup's
//! hugetlb limit (upstream `ResourceConfigForPod`'s `HugePageLimit`) and 0 for every other
//! size the host has, written where this machine keeps the hugetlb controller (a v1
//! hierarchy, the unified tree, or a hybrid host's unified mount) and read back from
//! `/sys/fs/cgroup`. No hugepages need be reserved to set a limit. Needs root (skipped with a
//! message without it; `CI=true` makes that a failure).

use k8s_openapi::api::core::v1::Pod;
use skerry_node::cgroups::pod::{GUARANTEED, resource_config_for_pod};
use skerry_node::cgroups::{CgroupManager, hugepage_sizes};

fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the hugetlb cgroup test needs root in CI"
    );
    eprintln!("skipping: the hugetlb cgroup test needs root");
    false
}

#[tokio::test]
async fn a_pod_s_hugepages_are_its_pod_cgroup_s_hugetlb_limits() {
    if !root_or_skip() {
        return;
    }
    let manager = CgroupManager::detect().expect("cgroups");
    let sizes = hugepage_sizes();
    let name = format!("/skerry-hugetlb-test-{}/pod", std::process::id());
    let Some((dir, v2)) = manager.hugetlb_path(&name) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no hugetlb controller on this host"
        );
        eprintln!("skipping: no hugetlb controller on this host");
        return;
    };
    if !sizes.iter().any(|s| s == "2MB") {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the kernel has no 2 MiB hugepages"
        );
        eprintln!("skipping: the kernel has no 2 MiB hugepages");
        return;
    }
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "huge", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {
            "requests": {"cpu": "100m", "memory": "16Mi", "hugepages-2Mi": "6Mi"},
            "limits": {"cpu": "100m", "memory": "16Mi", "hugepages-2Mi": "6Mi"}}}]}
    }))
    .expect("a pod");
    let config = resource_config_for_pod(&pod, GUARANTEED, -1);
    let created = manager.create(&name, &config);
    let file = |size: &str| {
        if v2 {
            dir.join(format!("hugetlb.{size}.max"))
        } else {
            dir.join(format!("hugetlb.{size}.limit_in_bytes"))
        }
    };
    let read: Vec<(String, Option<String>)> = sizes
        .iter()
        .map(|s| {
            let text = std::fs::read_to_string(file(s)).ok();
            (s.clone(), text.map(|t| t.trim().to_string()))
        })
        .collect();
    let observed = manager.read(&name);
    let parent = name.trim_end_matches("/pod").to_string();
    let _ = manager.destroy(&name).await;
    let _ = manager.destroy(&parent).await;
    created.expect("create the pod cgroup");
    println!("hugetlb in {} (v2 files: {v2}): {read:?}", dir.display());
    for (size, text) in &read {
        let want = if size == "2MB" { 6u64 << 20 } else { 0 };
        assert_eq!(text.as_deref(), Some(want.to_string().as_str()), "{size}");
    }
    let observed = observed.expect("read back");
    assert_eq!(observed.hugepage_limits.get("2MB"), Some(&(6i64 << 20)));
    assert!(!manager.exists(&name), "the test's cgroup is removed");
}
