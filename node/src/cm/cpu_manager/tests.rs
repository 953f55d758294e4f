use super::*;
use crate::cm::topology::{ERROR_TOPOLOGY_AFFINITY, Policy, Scope, TopologyManager};

fn pod(uid: &str, containers: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": containers}
    }))
    .expect("pod")
}

fn guaranteed(uid: &str, cpu: &str) -> Pod {
    pod(
        uid,
        serde_json::json!([{"name": "c", "resources": {
            "requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}}}]),
    )
}

fn burstable(uid: &str) -> Pod {
    pod(
        uid,
        serde_json::json!([{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]),
    )
}

/// This machine's shape: one NUMA node, two single-thread cores.
fn two_cpus() -> Machine {
    Machine::from_table(&[(0, 0, 0, 0), (1, 1, 0, 0)], 1 << 30)
}

/// Two NUMA nodes (= sockets) of two cores each.
fn two_nodes() -> Machine {
    Machine::from_table(
        &[(0, 0, 0, 0), (1, 1, 0, 0), (2, 2, 1, 1), (3, 3, 1, 1)],
        1 << 30,
    )
}

fn set(c: &[u32]) -> CpuSet {
    c.iter().copied().collect()
}

fn static_manager(
    machine: Machine,
    dir: &std::path::Path,
    reserved: &[u32],
) -> Result<CpuManager, String> {
    CpuManager::new(
        POLICY_STATIC,
        Some(StaticConfig {
            reserved_cpus: Some(set(reserved)),
            reserved_milli: reserved.len() as i64 * 1000,
        }),
        machine,
        CheckpointManager::new(dir).expect("checkpoints"),
    )
}

fn topology(
    m: &Arc<CpuManager>,
    machine: &Machine,
    policy: Policy,
    scope: Scope,
) -> TopologyManager {
    let provider: Arc<dyn HintProvider> = m.clone();
    TopologyManager::new(policy, scope, machine.numa_nodes(), vec![provider]).expect("manager")
}

#[test]
fn guaranteed_integer_requests_only() {
    let c = |cpu: &str| -> Container {
        serde_json::from_value(
            serde_json::json!({"name": "c", "resources": {"requests": {"cpu": cpu}}}),
        )
        .expect("container")
    };
    assert_eq!(guaranteed_cpus("Guaranteed", &c("2")), 2);
    assert_eq!(guaranteed_cpus("Guaranteed", &c("2000m")), 2);
    assert_eq!(guaranteed_cpus("Guaranteed", &c("1500m")), 0);
    assert_eq!(guaranteed_cpus("Burstable", &c("1")), 0);
}

#[test]
fn exclusive_cpu_leaves_the_shared_pool_and_comes_back() {
    let dir = tempfile::tempdir().expect("tmp");
    let machine = two_cpus();
    let m = Arc::new(static_manager(machine.clone(), dir.path(), &[0]).expect("static"));
    assert_eq!(
        m.shared_pool(),
        set(&[0, 1]),
        "reserved CPUs stay in the shared pool"
    );
    let tm = topology(&m, &machine, Policy::None, Scope::Container);
    let g = guaranteed("g", "1");
    tm.admit(&g).expect("admitted");
    assert_eq!(
        m.exclusive("g", "c"),
        Some(set(&[1])),
        "never the reserved CPU"
    );
    assert_eq!(m.cpuset_for("g", "c"), Some(set(&[1])));
    assert_eq!(m.shared_pool(), set(&[0]));
    let b = burstable("b");
    tm.admit(&b).expect("admitted");
    assert_eq!(m.cpuset_for("b", "c"), Some(set(&[0])), "the shared pool");
    // The checkpoint has it, as upstream writes it.
    let text = std::fs::read_to_string(dir.path().join("cpu_manager_state")).expect("checkpoint");
    assert!(
        text.contains(r#""policyName":"static","defaultCpuSet":"0","entries":{"g":{"c":"1"}}"#),
        "{text}"
    );
    // A second Guaranteed pod finds nothing left but the reserved CPU.
    let err = tm.admit(&guaranteed("g2", "1")).expect_err("no CPU left");
    assert_eq!(err.reason, "UnexpectedAdmissionError");
    assert_eq!(
        err.message,
        "Allocate failed due to not enough cpus available to satisfy request: requested=1, available=0, which is unexpected"
    );
    // A restart restores the state from the checkpoint.
    drop(tm);
    let again = static_manager(machine.clone(), dir.path(), &[0]).expect("restored");
    assert_eq!(again.exclusive("g", "c"), Some(set(&[1])));
    // The pod is gone: its CPU returns to the pool.
    again.remove_stale_state(&HashSet::from([("b".to_string(), "c".to_string())]));
    assert_eq!(again.shared_pool(), set(&[0, 1]));
    assert_eq!(again.exclusive("g", "c"), None);
}

#[test]
fn refuses_a_checkpoint_that_does_not_fit() {
    let dir = tempfile::tempdir().expect("tmp");
    static_manager(two_cpus(), dir.path(), &[0]).expect("static");
    // Another policy's file.
    let e = CpuManager::new(
        POLICY_NONE,
        None,
        two_cpus(),
        CheckpointManager::new(dir.path()).expect("checkpoints"),
    )
    .err()
    .expect("refused");
    assert!(
        e.contains("configured policy \"none\" differs from state checkpoint policy \"static\""),
        "{e}"
    );
    // A machine with more CPUs than the state knows.
    let e = static_manager(two_nodes(), dir.path(), &[0])
        .err()
        .expect("refused");
    assert!(
        e.contains(
            "current set of available CPUs \"0-3\" doesn't match with CPUs in state \"0-1\""
        ),
        "{e}"
    );
    // A corrupt file.
    let path = dir.path().join("cpu_manager_state");
    let text = std::fs::read_to_string(&path).expect("read");
    std::fs::write(&path, text.replace("\"0-1\"", "\"0\"")).expect("write");
    let e = static_manager(two_cpus(), dir.path(), &[0])
        .err()
        .expect("refused");
    assert!(
        e.contains("please drain this node and delete the CPU manager checkpoint file"),
        "{e}"
    );
    // No reservation at all.
    let fresh = tempfile::tempdir().expect("tmp");
    let e = CpuManager::new(
        POLICY_STATIC,
        Some(StaticConfig {
            reserved_cpus: None,
            reserved_milli: 0,
        }),
        two_cpus(),
        CheckpointManager::new(fresh.path()).expect("checkpoints"),
    )
    .err()
    .expect("refused");
    assert_eq!(
        e,
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    );
    // 1500m of reservation is two CPUs, picked packed.
    let m = CpuManager::new(
        POLICY_STATIC,
        Some(StaticConfig {
            reserved_cpus: None,
            reserved_milli: 1500,
        }),
        two_nodes(),
        CheckpointManager::new(fresh.path()).expect("checkpoints"),
    )
    .expect("static");
    assert_eq!(
        m.policy.as_ref().map(|p| p.reserved.clone()),
        Some(set(&[0, 1]))
    );
}

#[test]
fn numa_hints_and_aligned_allocation_on_two_nodes() {
    let dir = tempfile::tempdir().expect("tmp");
    let machine = two_nodes();
    // CPU 0 reserved: node 0 has one free CPU, node 1 two.
    let m = Arc::new(static_manager(machine.clone(), dir.path(), &[0]).expect("static"));
    let two = guaranteed("two", "2");
    let hints = m.container_hints(&two, &two.spec.as_ref().expect("spec").containers[0]);
    let cpu = hints["cpu"].clone().expect("hints");
    let masks: Vec<(Vec<u32>, bool)> = cpu
        .iter()
        .map(|h| {
            (
                h.affinity.map(|a| a.bits()).unwrap_or_default(),
                h.preferred,
            )
        })
        .collect();
    // Node 0 alone has too few free CPUs; node 1 fits and is as narrow as can be.
    assert_eq!(masks, vec![(vec![1], true), (vec![0, 1], false)]);
    let tm = topology(&m, &machine, Policy::SingleNumaNode, Scope::Container);
    tm.admit(&two).expect("admitted on node 1");
    assert_eq!(m.exclusive("two", "c"), Some(set(&[2, 3])));
    // Now only CPU 1 is free: a 1-CPU pod fits node 0.
    let one = guaranteed("one", "1");
    tm.admit(&one).expect("admitted");
    assert_eq!(m.exclusive("one", "c"), Some(set(&[1])));
    // A Burstable pod has no preference: admitted under single-numa-node.
    tm.admit(&burstable("b"))
        .expect("no preference is no signal");
}

#[test]
fn single_numa_node_refuses_what_restricted_admits() {
    // Four CPUs on a machine of two 3-CPU nodes need both nodes: that is the narrowest
    // possible, so preferred.
    let dir = tempfile::tempdir().expect("tmp");
    let m = Arc::new(
        CpuManager::new(
            POLICY_STATIC,
            Some(StaticConfig {
                reserved_cpus: Some(set(&[0])),
                reserved_milli: 1000,
            }),
            Machine::from_table(
                &[
                    (0, 0, 0, 0),
                    (1, 1, 0, 0),
                    (2, 2, 0, 0),
                    (3, 3, 1, 1),
                    (4, 4, 1, 1),
                    (5, 5, 1, 1),
                ],
                1 << 30,
            ),
            CheckpointManager::new(dir.path()).expect("checkpoints"),
        )
        .expect("static"),
    );
    let nodes = vec![0, 1];
    let single = TopologyManager::new(
        Policy::SingleNumaNode,
        Scope::Container,
        nodes.clone(),
        vec![m.clone() as Arc<dyn HintProvider>],
    )
    .expect("tm");
    let four = guaranteed("four", "4");
    let e = single.admit(&four).expect_err("refused");
    assert_eq!(
        (e.reason.as_str(), e.message.as_str()),
        (
            ERROR_TOPOLOGY_AFFINITY,
            "Resources cannot be allocated with Topology locality"
        )
    );
    assert_eq!(
        m.shared_pool(),
        set(&[0, 1, 2, 3, 4, 5]),
        "nothing allocated for a refused pod"
    );
    let restricted = TopologyManager::new(
        Policy::Restricted,
        Scope::Container,
        nodes,
        vec![m.clone() as Arc<dyn HintProvider>],
    )
    .expect("tm");
    restricted
        .admit(&four)
        .expect("both nodes are the narrowest fit");
    assert_eq!(m.exclusive("four", "c").map(|s| s.len()), Some(4));
}

#[test]
fn pod_scope_merges_once_for_the_whole_pod() {
    let dir = tempfile::tempdir().expect("tmp");
    let machine = two_nodes();
    let m = Arc::new(static_manager(machine.clone(), dir.path(), &[0]).expect("static"));
    let res = serde_json::json!({"requests": {"cpu": "1", "memory": "1Mi"}, "limits": {"cpu": "1", "memory": "1Mi"}});
    let p = pod(
        "p",
        serde_json::json!([{"name": "a", "resources": res}, {"name": "b", "resources": res}]),
    );
    // Container scope could put a on node 0 (CPU 1) and b on node 1; pod scope wants both on
    // one node: only node 1 has two free CPUs.
    let tm = topology(&m, &machine, Policy::SingleNumaNode, Scope::Pod);
    tm.admit(&p).expect("admitted");
    let both: CpuSet = ["a", "b"]
        .iter()
        .flat_map(|c| m.exclusive("p", c).unwrap_or_default())
        .collect();
    assert_eq!(both, set(&[2, 3]));
    assert_eq!(
        tm.affinity("p", "a")
            .and_then(|h| h.affinity)
            .map(|a| a.bits()),
        Some(vec![1])
    );
}
