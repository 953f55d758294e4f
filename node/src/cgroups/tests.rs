//! The conversions against upstream's tables, the mountinfo parsing, and both layouts over
//! a temporary directory laid out as cgroupfs.

use super::*;

#[test]
fn shares_as_milli_cpu_to_shares() {
    // `helpers_linux.go` `MilliCPUToShares`: the kernel's minimum for nothing, 1024 a CPU,
    // capped at the kernel's maximum.
    for (milli, shares) in [
        (0, 2),
        (1, 2),
        (2, 2),
        (100, 102),
        (300, 307),
        (1000, 1024),
        (1900, 1945),
        (256_000, 262_144),
        (300_000, 262_144),
    ] {
        assert_eq!(milli_cpu_to_shares(milli), shares, "{milli}m");
    }
}

#[test]
fn quota_as_milli_cpu_to_quota() {
    // `helpers_linux_test.go` `TestMilliCPUToQuota` (period 100000).
    for (milli, quota) in [
        (0, 0),
        (5, 1000),
        (9, 1000),
        (10, 1000),
        (200, 20_000),
        (500, 50_000),
        (1000, 100_000),
        (1500, 150_000),
    ] {
        assert_eq!(milli_cpu_to_quota(milli, QUOTA_PERIOD), quota, "{milli}m");
    }
    assert_eq!(milli_cpu_to_quota(500, 50_000), 25_000, "another period");
}

#[test]
fn weight_as_cpu_shares_to_cpu_weight() {
    // runc's `TestConvertCPUSharesToCgroupV2Value`, and the kubelet's common values.
    for (shares, weight) in [(0, 0), (2, 1), (102, 4), (1024, 39), (262_144, 10_000)] {
        assert_eq!(cpu_shares_to_weight(shares), weight, "{shares} shares");
    }
}

const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 / /sys/fs/cgroup/net\\040cls rw,relatime - cgroup cgroup rw,net_cls,net_prio
";

#[test]
fn mountinfo_hybrid_is_v1_with_every_hierarchy() {
    let m = CgroupManager::from_mountinfo(HYBRID).expect("cgroups");
    assert!(!m.is_v2());
    assert_eq!(
        m.path("memory", "/kubepods/pod1"),
        Some(PathBuf::from("/sys/fs/cgroup/memory/kubepods/pod1"))
    );
    assert_eq!(
        m.path("net_prio", "/a"),
        Some(PathBuf::from("/sys/fs/cgroup/net cls/a")),
        "escaped mount points, co-mounted controllers"
    );
    let Layout::V1(h) = m.layout() else {
        panic!("v1")
    };
    assert_eq!(h.get(""), Some(&PathBuf::from("/sys/fs/cgroup/unified")));
    assert_eq!(
        h.get("xattr,name=systemd"),
        Some(&PathBuf::from("/sys/fs/cgroup/systemd"))
    );
}

#[test]
fn mountinfo_unified_is_v2() {
    let m = CgroupManager::from_mountinfo(
        "25 19 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    .expect("cgroups");
    assert_eq!(m.layout(), &Layout::V2(PathBuf::from("/sys/fs/cgroup")));
    assert!(CgroupManager::from_mountinfo("1 0 0:1 / / rw - ext4 /dev/sda rw\n").is_err());
}

/// A v2 root as the kernel lays it out (only what the manager reads).
fn fake_v2() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("cgroup.subtree_control"), "cpu\n").unwrap();
    dir
}

#[tokio::test]
async fn v2_create_enables_controllers_and_writes_limits() {
    let root = fake_v2();
    let m = CgroupManager::v2(root.path().to_path_buf());
    let config = ResourceConfig {
        cpu_shares: Some(1024),
        cpu_quota: Some(50_000),
        cpu_period: Some(QUOTA_PERIOD),
        memory: Some(128 << 20),
        pids_limit: Some(100),
        hugepage_limits: None,
    };
    m.create("/kubepods/burstable/podX", &config)
        .expect("create");
    assert_eq!(
        std::fs::read_to_string(root.path().join("cgroup.subtree_control")).unwrap(),
        "+cpuset +io +memory +pids",
        "the root's missing controllers enabled for its children in one write"
    );
    let pod = root.path().join("kubepods/burstable/podX");
    let read = |f: &str| std::fs::read_to_string(pod.join(f)).unwrap();
    assert_eq!(read("cpu.weight"), "39");
    assert_eq!(read("cpu.max"), "50000 100000");
    assert_eq!(read("memory.max"), "134217728");
    assert_eq!(read("pids.max"), "100");
    let o = m.read("/kubepods/burstable/podX").expect("read");
    assert_eq!(o.cpu_weight, Some(39));
    assert_eq!(o.cpu_quota, Some(50_000));
    assert_eq!(o.cpu_period, Some(100_000));
    assert_eq!(o.memory, Some(128 << 20));
    assert!(m.exists("/kubepods/burstable/podX"));

    // Unlimited: `max`.
    m.update(
        "/kubepods/burstable/podX",
        &ResourceConfig {
            cpu_quota: Some(-1),
            cpu_period: Some(QUOTA_PERIOD),
            memory: Some(-1),
            pids_limit: Some(-1),
            ..Default::default()
        },
    )
    .expect("update");
    assert_eq!(read("cpu.max"), "max 100000");
    assert_eq!(read("memory.max"), "max");
    let o = m.read("/kubepods/burstable/podX").expect("read");
    assert_eq!(
        (o.cpu_quota, o.memory, o.pids_limit),
        (Some(-1), Some(-1), Some(-1))
    );

    // Removal takes what runc left below, deepest first (regular files stand in for the
    // kernel's, which `rmdir` ignores; removed here by hand).
    let runc = pod.join("container1");
    std::fs::create_dir_all(&runc).unwrap();
    for d in [&runc, &pod] {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            if e.file_type().unwrap().is_file() {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
    }
    m.destroy("/kubepods/burstable/podX")
        .await
        .expect("destroy");
    assert!(!pod.exists());
    assert!(root.path().join("kubepods/burstable").is_dir());
    m.destroy("/kubepods/burstable/podX")
        .await
        .expect("gone already is fine");
}

#[test]
fn v1_writes_each_controller_in_its_hierarchy() {
    let root = tempfile::tempdir().expect("tempdir");
    let h: Vec<(String, PathBuf)> = ["cpu", "memory", "pids", "cpuset", "name=systemd"]
        .iter()
        .map(|c| {
            (
                c.to_string(),
                root.path().join(c.trim_start_matches("name=")),
            )
        })
        .collect();
    for (_, p) in &h {
        std::fs::create_dir_all(p).unwrap();
    }
    std::fs::write(root.path().join("cpuset/cpuset.cpus"), "0-1\n").unwrap();
    std::fs::write(root.path().join("cpuset/cpuset.mems"), "0\n").unwrap();
    let m = CgroupManager::v1(h);
    let config = ResourceConfig {
        cpu_shares: Some(307),
        cpu_quota: Some(30_000),
        cpu_period: Some(QUOTA_PERIOD),
        memory: Some(150 << 20),
        pids_limit: Some(-1),
        hugepage_limits: None,
    };
    m.create("/kp/podY", &config).expect("create");
    let read = |c: &str, f: &str| {
        std::fs::read_to_string(root.path().join(c).join("kp/podY").join(f)).unwrap()
    };
    assert_eq!(read("cpu", "cpu.shares"), "307");
    assert_eq!(read("cpu", "cpu.cfs_quota_us"), "30000");
    assert_eq!(read("cpu", "cpu.cfs_period_us"), "100000");
    assert_eq!(read("memory", "memory.limit_in_bytes"), "157286400");
    assert_eq!(read("pids", "pids.max"), "max");
    assert_eq!(
        read("cpuset", "cpuset.cpus"),
        "0-1",
        "the parent's CPUs copied down"
    );
    assert!(
        root.path().join("systemd/kp/podY").is_dir(),
        "every hierarchy"
    );
    let o = m.read("/kp/podY").expect("read");
    assert_eq!(o.cpu_shares, Some(307));
    assert_eq!(o.memory, Some(150 << 20));
    assert_eq!(o.pids_limit, Some(-1));
}

#[test]
fn page_sizes_as_the_kernel_names_them() {
    // `v1helper.HugePageUnitSizeFromByteSize` (helpers_test.go's table).
    for (bytes, name) in [
        (1024, Some("1KB")),
        (33_554_432, Some("32MB")),
        (1_073_741_824, Some("1GB")),
        (2_097_152, Some("2MB")),
        (100, Some("100B")),
        (1025, None),
    ] {
        assert_eq!(hugepage_unit_size(bytes).as_deref(), name, "{bytes}");
    }
    let dir = tempfile::tempdir().unwrap();
    for pool in ["hugepages-1048576kB", "hugepages-2048kB", "not-a-pool"] {
        std::fs::create_dir(dir.path().join(pool)).unwrap();
    }
    assert_eq!(hugepage_sizes_in(dir.path()), ["2MB", "1GB"]);
    assert!(hugepage_sizes_in(&dir.path().join("absent")).is_empty());
}

#[test]
fn hugetlb_limits_go_to_the_hybrid_hosts_unified_mount() {
    // v1 hierarchies without hugetlb, the unified mount beside them carrying it.
    let root = tempfile::tempdir().unwrap();
    let cpu = root.path().join("cpu");
    let unified = root.path().join("unified");
    std::fs::create_dir_all(&cpu).unwrap();
    std::fs::create_dir_all(&unified).unwrap();
    std::fs::write(unified.join("cgroup.controllers"), "hugetlb\n").unwrap();
    std::fs::write(unified.join("cgroup.subtree_control"), "").unwrap();
    let m = CgroupManager::v1([
        ("cpu".to_string(), cpu.clone()),
        (String::new(), unified.clone()),
    ]);
    let limits: BTreeMap<String, u64> =
        [("2MB".to_string(), 4 << 20), ("1GB".to_string(), 0)].into();
    m.create(
        "/kp/podZ",
        &ResourceConfig {
            hugepage_limits: Some(limits),
            ..Default::default()
        },
    )
    .expect("create");
    assert_eq!(
        std::fs::read_to_string(unified.join("cgroup.subtree_control")).unwrap(),
        "+hugetlb",
        "the unified root lets its children use hugetlb"
    );
    let pod = unified.join("kp/podZ");
    assert_eq!(
        std::fs::read_to_string(pod.join("hugetlb.2MB.max")).unwrap(),
        "4194304"
    );
    assert_eq!(
        std::fs::read_to_string(pod.join("hugetlb.1GB.max")).unwrap(),
        "0"
    );
    assert!(!cpu.join("kp/podZ/hugetlb.2MB.limit_in_bytes").exists());

    // A v1 hugetlb hierarchy takes them as `limit_in_bytes`.
    let hugetlb = root.path().join("hugetlb");
    std::fs::create_dir_all(&hugetlb).unwrap();
    let m = CgroupManager::v1([("hugetlb".to_string(), hugetlb.clone())]);
    m.create(
        "/kp/podZ",
        &ResourceConfig {
            hugepage_limits: Some([("2MB".to_string(), 2 << 20)].into()),
            ..Default::default()
        },
    )
    .expect("create");
    assert_eq!(
        std::fs::read_to_string(hugetlb.join("kp/podZ/hugetlb.2MB.limit_in_bytes")).unwrap(),
        "2097152"
    );
}
