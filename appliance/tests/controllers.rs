//! The controllers through the real kubectl: Deployments roll out, roll back, scale and
//! cascade; namespaces empty themselves and go; every namespace gets its `default`
//! ServiceAccount; a PodDisruptionBudget holds `kubectl drain` back; every Node gets a pod
//! range from the default `--cluster-cidr`, or from the one given; and when the member
//! running the controllers dies, another takes the `kube-controller-manager` Lease and carries
//! on.
//!
//! There is no kubelet yet, so pods stay Pending unless [`FakeKubelet`] — a thread that
//! reports every pod Running and Ready through the status subresource, as a kubelet would —
//! is running.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::kube::*;

/// How long a controller gets to make the cluster converge after a kubectl command: its
/// informers see the write in milliseconds; the slack covers a debug build on a loaded 2-core
/// machine running other tests.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// The Lease the controllers' leader holds.
const LEASE: [&str; 5] = [
    "get",
    "lease",
    "kube-controller-manager",
    "-n",
    "kube-system",
];

/// Reports every pod of a namespace Running and Ready until dropped.
struct FakeKubelet {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeKubelet {
    fn start(kube: &Kube, namespace: &str) -> FakeKubelet {
        let stop = Arc::new(AtomicBool::new(false));
        let (kubeconfig, home, ns) = (
            kube.kubeconfig.clone(),
            kube.home.clone(),
            namespace.to_string(),
        );
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                let out = kubectl_as(
                    &kubeconfig,
                    &home,
                    &[
                        "get",
                        "pods",
                        "-n",
                        &ns,
                        "-o",
                        r#"jsonpath={range .items[*]}{.metadata.name} {.status.phase}{"\n"}{end}"#,
                    ],
                );
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    let mut parts = line.split_whitespace();
                    let (Some(pod), phase) = (parts.next(), parts.next()) else {
                        continue;
                    };
                    if phase == Some("Running") {
                        continue;
                    }
                    let status = format!(
                        r#"{{"status":{{"phase":"Running","podIP":"10.244.0.{}","conditions":[{{"type":"Ready","status":"True","lastTransitionTime":"2026-01-01T00:00:00Z"}}]}}}}"#,
                        pod.len() % 250 + 2
                    );
                    let _ = kubectl_as(
                        &kubeconfig,
                        &home,
                        &[
                            "patch",
                            "pod",
                            pod,
                            "-n",
                            &ns,
                            "--subresource=status",
                            "--type=merge",
                            "-p",
                            &status,
                        ],
                    );
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        FakeKubelet {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Polls `kubectl args` until `check` accepts its stdout; returns that stdout.
fn converge(kube: &Kube, args: &[&str], what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let out = kube.kubectl_output(args, None);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && check(&stdout) {
            return stdout;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not reached in {CONVERGE_TIMEOUT:?}; last `kubectl {args:?}`: {stdout}{}\nserver log tail:\n{}",
            String::from_utf8_lossy(&out.stderr),
            tail(&kube.log())
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// The names of the ReplicaSets of Deployment `web` in `shop`, with their replicas.
fn replica_sets(kube: &Kube) -> Vec<(String, String)> {
    let out = kube.ok(&[
        "get",
        "rs",
        "-n",
        "shop",
        "-l",
        "app=web",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.spec.replicas}{"\n"}{end}"#,
    ]);
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, r)| (n.to_string(), r.to_string()))
        .collect()
}

/// The pod-template-hash alphabet: no vowels, no 0, 1, 3 (so a name never spells a word).
fn is_hash_suffix(name: &str, deployment: &str) -> bool {
    name.strip_prefix(&format!("{deployment}-"))
        .is_some_and(|h| {
            !h.is_empty() && h.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
        })
}

#[test]
fn deployments_roll_out_roll_back_scale_down_and_delete_in_the_foreground() {
    let kube = Kube::start(&[]);
    kube.ok(&["create", "namespace", "shop"]);
    let kubelet = FakeKubelet::start(&kube, "shop");
    kube.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "shop",
        "--image=nginx:1.27",
        "--replicas=3",
    ]);
    // One ReplicaSet named by the template hash, three pods it owns.
    converge(
        &kube,
        &["get", "pods", "-n", "shop", "-l", "app=web", "-o", "name"],
        "3 pods",
        |s| s.lines().count() == 3,
    );
    let first = replica_sets(&kube);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(is_hash_suffix(&first[0].0, "web"), "{first:?}");
    let owners = kube.ok(&[
        "get",
        "pods",
        "-n",
        "shop",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].metadata.ownerReferences[0].name}",
    ]);
    assert_eq!(words(&owners), vec![first[0].0.clone(); 3]);
    kube.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "shop",
        "--timeout=60s",
    ]);

    // A new image rolls to a second ReplicaSet; the first ends at 0.
    kube.ok(&[
        "set",
        "image",
        "deployment/web",
        "-n",
        "shop",
        "nginx=nginx:1.28",
    ]);
    kube.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "shop",
        "--timeout=60s",
    ]);
    let rolled = replica_sets(&kube);
    assert_eq!(rolled.len(), 2, "{rolled:?}");
    let second = rolled
        .iter()
        .find(|(n, _)| *n != first[0].0)
        .expect("a second ReplicaSet")
        .clone();
    assert!(is_hash_suffix(&second.0, "web"), "{rolled:?}");
    assert_eq!(second.1, "3");
    assert!(
        rolled.contains(&(first[0].0.clone(), "0".to_string())),
        "{rolled:?}"
    );

    // `rollout undo` goes back to the first ReplicaSet (revision 3), not a third.
    kube.ok(&["rollout", "undo", "deployment/web", "-n", "shop"]);
    kube.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "shop",
        "--timeout=60s",
    ]);
    let undone = replica_sets(&kube);
    assert_eq!(undone.len(), 2, "{undone:?}");
    assert!(
        undone.contains(&(first[0].0.clone(), "3".to_string())),
        "{undone:?}"
    );
    assert!(
        undone.contains(&(second.0.clone(), "0".to_string())),
        "{undone:?}"
    );
    let revision = kube.ok(&[
        "get",
        "rs",
        &first[0].0,
        "-n",
        "shop",
        "-o",
        r#"jsonpath={.metadata.annotations.deployment\.kubernetes\.io/revision}"#,
    ]);
    assert_eq!(revision, "3");
    let image = kube.ok(&[
        "get",
        "deployment",
        "web",
        "-n",
        "shop",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(image, "nginx:1.27");

    // Scale up with the kubelet stopped: the two new pods stay Pending. Scaling back down
    // deletes exactly those (not ready before ready), not the three running ones.
    drop(kubelet);
    let running = words(&kube.ok(&[
        "get",
        "pods",
        "-n",
        "shop",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]));
    assert_eq!(running.len(), 3, "{running:?}");
    kube.ok(&["scale", "deployment/web", "-n", "shop", "--replicas=5"]);
    converge(
        &kube,
        &["get", "pods", "-n", "shop", "-l", "app=web", "-o", "name"],
        "5 pods",
        |s| s.lines().count() == 5,
    );
    kube.ok(&["scale", "deployment/web", "-n", "shop", "--replicas=3"]);
    let left = converge(
        &kube,
        &[
            "get",
            "pods",
            "-n",
            "shop",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        "3 pods after scaling down",
        |s| s.split_whitespace().count() == 3,
    );
    let mut left = words(&left);
    let mut running = running;
    left.sort();
    running.sort();
    assert_eq!(left, running, "scale down kept the ready pods");

    // Foreground deletion: kubectl waits until the Deployment is gone, which the garbage
    // collector allows only after its ReplicaSets and their pods are.
    kube.ok(&[
        "delete",
        "deployment",
        "web",
        "-n",
        "shop",
        "--cascade=foreground",
        "--timeout=60s",
    ]);
    assert_eq!(
        kube.ok(&[
            "get", "rs,pods", "-n", "shop", "-l", "app=web", "-o", "name"
        ]),
        ""
    );
}

/// A Node with nothing but its name, as a kubelet registers it (as far as IPAM cares).
fn node_yaml(name: &str) -> String {
    format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n")
}

fn pod_cidr(kube: &Kube, node: &str, want: &str) {
    converge(
        kube,
        &[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.spec.podCIDR} {.spec.podCIDRs[*]}",
        ],
        &format!("{node}'s pod CIDR {want}"),
        |s| s.trim() == format!("{want} {want}"),
    );
}

#[test]
fn nodes_get_pod_ranges_from_the_cluster_cidr() {
    // The README's command: no flag, k3s's 10.42.0.0/16 in /24s.
    let kube = Kube::start(&[]);
    kube.ok_in(&["create", "-f", "-"], Some(&node_yaml("box-a")));
    pod_cidr(&kube, "box-a", "10.42.0.0/24");
    kube.ok_in(&["create", "-f", "-"], Some(&node_yaml("box-b")));
    pod_cidr(&kube, "box-b", "10.42.1.0/24");
    drop(kube);

    let kube = Kube::start(&[
        "--cluster-cidr",
        "10.50.0.0/16",
        "--node-cidr-mask-size",
        "26",
    ]);
    kube.ok_in(&["create", "-f", "-"], Some(&node_yaml("box-a")));
    pod_cidr(&kube, "box-a", "10.50.0.0/26");
    drop(kube);

    let kube = Kube::start(&["--allocate-node-cidrs=false"]);
    kube.ok_in(&["create", "-f", "-"], Some(&node_yaml("box-a")));
    // The controllers are running (the default ServiceAccount appears), IPAM is not.
    converge(
        &kube,
        &["get", "serviceaccount", "default", "-o", "name"],
        "default ServiceAccount",
        |s| s.trim() == "serviceaccount/default",
    );
    std::thread::sleep(Duration::from_secs(2));
    let cidr = kube.ok(&["get", "node", "box-a", "-o", "jsonpath={.spec.podCIDR}"]);
    assert_eq!(cidr.trim(), "", "no range without --allocate-node-cidrs");
}

#[test]
fn namespaces_get_a_default_service_account_and_delete_their_contents() {
    let kube = Kube::start(&[]);
    kube.ok(&["create", "namespace", "tmp"]);
    converge(
        &kube,
        &[
            "get",
            "serviceaccount",
            "default",
            "-n",
            "tmp",
            "-o",
            "name",
        ],
        "default ServiceAccount",
        |s| s.trim() == "serviceaccount/default",
    );
    // A deleted default ServiceAccount comes back.
    kube.ok(&["delete", "serviceaccount", "default", "-n", "tmp"]);
    converge(
        &kube,
        &[
            "get",
            "serviceaccount",
            "default",
            "-n",
            "tmp",
            "-o",
            "name",
        ],
        "default ServiceAccount again",
        |s| s.trim() == "serviceaccount/default",
    );
    kube.ok(&[
        "create",
        "configmap",
        "c",
        "-n",
        "tmp",
        "--from-literal=k=v",
    ]);
    kube.ok(&[
        "create",
        "secret",
        "generic",
        "s",
        "-n",
        "tmp",
        "--from-literal=k=v",
    ]);
    kube.ok(&[
        "create",
        "deployment",
        "d",
        "-n",
        "tmp",
        "--image=nginx:1.27",
        "--replicas=2",
    ]);
    converge(
        &kube,
        &["get", "pods", "-n", "tmp", "-o", "name"],
        "2 pods",
        |s| s.lines().count() == 2,
    );
    // kubectl waits for the namespace to be gone: the namespace controller empties it and
    // removes the `kubernetes` finalizer.
    kube.ok(&["delete", "namespace", "tmp", "--timeout=60s"]);
    let err = kube.fails(&["get", "namespace", "tmp"], None);
    assert!(err.contains("NotFound"), "{err}");
}

#[test]
fn a_killed_leader_hands_the_controllers_to_another_member_within_the_lease_time() {
    let Cluster {
        mut members,
        home,
        root: _root,
    } = Cluster::start();
    let holder = |m: &Member| -> String {
        let mut args = LEASE.to_vec();
        args.extend(["-o", "jsonpath={.spec.holderIdentity}"]);
        eventually(&m.kubeconfig, &home, &args, &m.log)
    };
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    let leader = loop {
        let h = holder(&members[0]);
        if !h.is_empty() {
            break h;
        }
        assert!(Instant::now() < deadline, "no controller leader elected");
        std::thread::sleep(Duration::from_millis(250));
    };
    // Identities are `<member name>_<random hex>`.
    let index = ["n1", "n2", "n3"]
        .iter()
        .position(|n| leader.starts_with(&format!("{n}_")))
        .unwrap_or_else(|| panic!("leader identity {leader:?} names no member"));
    drop(members.remove(index));
    let killed = Instant::now();
    let new_leader = loop {
        let out = kubectl_as(
            &members[0].kubeconfig,
            &home,
            &[LEASE.as_slice(), &["-o", "jsonpath={.spec.holderIdentity}"]].concat(),
        );
        let h = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && !h.is_empty() && h != leader {
            break h;
        }
        assert!(
            killed.elapsed() < CONVERGE_TIMEOUT,
            "nobody took over from {leader}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let took = killed.elapsed();
    // The lease is 15 s; a candidate acquires on its first retry (2 s, jittered up to 2.2 x)
    // after the lease runs out, measured from the last renewal before the kill.
    assert!(
        took < Duration::from_secs(15 + 5 + 5),
        "{new_leader} took over after {took:?}"
    );
    eprintln!("{new_leader} took over from {leader} {took:?} after the kill");
    // The new leader's controllers work: a Deployment gets its ReplicaSet and pods.
    eventually(
        &members[0].kubeconfig,
        &home,
        &[
            "create",
            "deployment",
            "after",
            "--image=nginx:1.27",
            "--replicas=2",
        ],
        &members[0].log,
    );
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let out = kubectl_as(
            &members[1].kubeconfig,
            &home,
            &["get", "pods", "-l", "app=after", "-o", "name"],
        );
        if String::from_utf8_lossy(&out.stdout).lines().count() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new leader's controllers made no pods\n{}",
            tail(&std::fs::read_to_string(&members[1].log).unwrap_or_default())
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

const NODES_AND_WORKLOADS: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: box-1
  labels:
    topology.kubernetes.io/zone: hall-a
---
apiVersion: v1
kind: Node
metadata:
  name: box-2
  labels:
    topology.kubernetes.io/zone: hall-a
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
  namespace: edge
spec:
  selector:
    matchLabels:
      app: agent
  template:
    metadata:
      labels:
        app: agent
    spec:
      containers:
      - name: agent
        image: busybox:1.36
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
  namespace: edge
spec:
  serviceName: db
  replicas: 3
  selector:
    matchLabels:
      app: db
  template:
    metadata:
      labels:
        app: db
    spec:
      containers:
      - name: db
        image: postgres:17
        ports:
        - name: sql
          containerPort: 5432
---
apiVersion: v1
kind: Service
metadata:
  name: db
  namespace: edge
spec:
  selector:
    app: db
  ports:
  - port: 5432
    targetPort: sql
"#;

#[test]
fn daemonsets_statefulsets_and_the_endpoints_of_a_service() {
    let kube = Kube::start(&[]);
    kube.ok(&["create", "namespace", "edge"]);
    let manifest = kube.path("edge.yaml");
    std::fs::write(&manifest, NODES_AND_WORKLOADS).expect("write manifest");
    kube.ok(&["apply", "-f", &manifest.display().to_string()]);
    // One daemon pod per node, pinned by node affinity (the scheduler binds it).
    let pinned = converge(
        &kube,
        &[
            "get",
            "pods",
            "-n",
            "edge",
            "-l",
            "app=agent",
            "-o",
            r#"jsonpath={range .items[*]}{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values[0]}{"\n"}{end}"#,
        ],
        "a daemon pod per node",
        |s| s.lines().count() == 2,
    );
    let mut nodes = words(&pinned);
    nodes.sort();
    assert_eq!(nodes, ["box-1", "box-2"]);
    // OrderedReady: db-0 alone until it runs and is ready.
    converge(
        &kube,
        &["get", "pods", "-n", "edge", "-l", "app=db", "-o", "name"],
        "db-0",
        |s| s.trim() == "pod/db-0",
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        kube.ok(&["get", "pods", "-n", "edge", "-l", "app=db", "-o", "name"])
            .trim(),
        "pod/db-0",
        "db-1 must wait for db-0 to be ready"
    );
    let kubelet = FakeKubelet::start(&kube, "edge");
    converge(
        &kube,
        &[
            "get",
            "statefulset",
            "db",
            "-n",
            "edge",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ],
        "3 ready db replicas",
        |s| s == "3",
    );
    // The Service's endpoints: the three db pods, on the named port.
    let endpoints = converge(
        &kube,
        &[
            "get",
            "endpoints",
            "db",
            "-n",
            "edge",
            "-o",
            r#"jsonpath={range .subsets[*].addresses[*]}{.targetRef.name}{"\n"}{end}"#,
        ],
        "3 endpoint addresses",
        |s| s.lines().count() == 3,
    );
    let mut pods = words(&endpoints);
    pods.sort();
    assert_eq!(pods, ["db-0", "db-1", "db-2"]);
    let slice = converge(
        &kube,
        &[
            "get",
            "endpointslices",
            "-n",
            "edge",
            "-l",
            "kubernetes.io/service-name=db",
            "-o",
            r#"jsonpath={range .items[*].endpoints[*]}{.targetRef.name} {.conditions.ready}{"\n"}{end}"#,
        ],
        "an EndpointSlice with 3 ready endpoints",
        |s| s.lines().filter(|l| l.ends_with(" true")).count() == 3,
    );
    assert_eq!(slice.lines().count(), 3, "{slice}");
    let port = kube.ok(&[
        "get",
        "endpoints",
        "db",
        "-n",
        "edge",
        "-o",
        "jsonpath={.subsets[0].ports[0].port}",
    ]);
    assert_eq!(port, "5432");
    drop(kubelet);
}

/// Two nodes with 2 CPUs each, as a kubelet would register them (no kubelet runs: the test
/// writes their status itself).
const TWO_NODES: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: box-a
  labels:
    kubernetes.io/hostname: box-a
---
apiVersion: v1
kind: Node
metadata:
  name: box-b
  labels:
    kubernetes.io/hostname: box-b
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: vip
value: 1000
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 4
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: web
        image: nginx:1.27
        resources:
          requests:
            cpu: 700m
"#;

const NODE_STATUS: &str = r#"{"status":{"capacity":{"cpu":"2","memory":"4Gi","pods":"110"},"allocatable":{"cpu":"2","memory":"4Gi","pods":"110"},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#;

fn pod(name: &str, cpu: &str, priority_class: Option<&str>) -> String {
    let class = priority_class
        .map(|c| format!("\n  priorityClassName: {c}"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:{class}\n  containers:\n  - name: c\n    image: busybox:1.36\n    resources:\n      requests:\n        cpu: {cpu}\n"
    )
}

#[test]
fn the_scheduler_binds_pods_reports_what_does_not_fit_and_preempts_by_priority() {
    let kube = Kube::start(&[]);
    let manifest = kube.path("cluster.yaml");
    std::fs::write(&manifest, TWO_NODES).expect("write manifest");
    kube.ok(&["apply", "-f", &manifest.display().to_string()]);
    for node in ["box-a", "box-b"] {
        kube.ok(&[
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            NODE_STATUS,
        ]);
    }
    // Four pods of 700m on two 2-CPU nodes: LeastAllocated spreads them two and two.
    let placed = converge(
        &kube,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            r#"jsonpath={range .items[*]}{.spec.nodeName}{"\n"}{end}"#,
        ],
        "4 web pods bound",
        |s| s.lines().filter(|l| !l.is_empty()).count() == 4,
    );
    let on_a = placed.lines().filter(|l| *l == "box-a").count();
    assert_eq!(on_a, 2, "{placed}");
    // A pod bigger than any node stays Pending, and says why.
    let big = kube.path("big.yaml");
    std::fs::write(&big, pod("big", "3", None)).expect("write pod");
    kube.ok(&["apply", "-f", &big.display().to_string()]);
    let described = converge(
        &kube,
        &["describe", "pod", "big"],
        "FailedScheduling on the big pod",
        |s| s.contains("FailedScheduling"),
    );
    assert!(
        described.contains("0/2 nodes are available: 2 Insufficient cpu."),
        "{described}"
    );
    // A high-priority pod that fits nowhere preempts: lower-priority victims on one node are
    // deleted (gracefully: with no kubelet they stay Terminating) and the node is nominated.
    let vip = kube.path("vip.yaml");
    std::fs::write(&vip, pod("vip", "1200m", Some("vip"))).expect("write pod");
    kube.ok(&["apply", "-f", &vip.display().to_string()]);
    assert_eq!(
        kube.ok(&["get", "pod", "vip", "-o", "jsonpath={.spec.priority}"]),
        "1000"
    );
    let nominated = converge(
        &kube,
        &[
            "get",
            "pod",
            "vip",
            "-o",
            "jsonpath={.status.nominatedNodeName}",
        ],
        "vip nominated to a node",
        |s| s == "box-a" || s == "box-b",
    );
    let victims = converge(
        &kube,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            r#"jsonpath={range .items[?(@.metadata.deletionTimestamp)]}{.spec.nodeName}{"\n"}{end}"#,
        ],
        "victims terminating",
        |s| !s.trim().is_empty(),
    );
    assert!(
        victims.lines().all(|n| n == nominated),
        "victims {victims:?} are on the nominated node {nominated}"
    );
    let events = kube.ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=Preempted",
        "-o",
        "name",
    ]);
    assert!(!events.trim().is_empty(), "no Preempted event");
}

/// One node as a kubelet registers it, status included.
const ONE_NODE: &str = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"box-a","labels":{"kubernetes.io/hostname":"box-a"}},"status":{"capacity":{"cpu":"4","memory":"8Gi","pods":"110"},"allocatable":{"cpu":"4","memory":"8Gi","pods":"110"},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#;

/// The `web` pods bound to box-a and not being deleted.
fn web_pods_on_box_a(kube: &Kube) -> Vec<String> {
    kube.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        r#"jsonpath={range .items[?(@.spec.nodeName=="box-a")]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ])
    .lines()
    .filter_map(|l| {
        let mut parts = l.split_whitespace();
        let name = parts.next()?;
        parts.next().is_none().then(|| name.to_string())
    })
    .collect()
}

#[test]
fn a_pod_disruption_budget_holds_kubectl_drain_back() {
    let kube = Kube::start(&[]);
    kube.ok_in(&["apply", "-f", "-"], Some(ONE_NODE));
    kube.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx:1.27",
        "--replicas=3",
    ]);
    kube.ok(&[
        "create",
        "poddisruptionbudget",
        "web",
        "--selector=app=web",
        "--min-available=2",
    ]);
    // The three pods run and are Ready on box-a: the disruption controller allows one
    // disruption (3 healthy, 2 needed).
    let kubelet = FakeKubelet::start(&kube, "default");
    converge(
        &kube,
        &[
            "get",
            "pdb",
            "web",
            "-o",
            "jsonpath={.status.expectedPods} {.status.currentHealthy} {.status.desiredHealthy} {.status.disruptionsAllowed}",
        ],
        "the budget allows one disruption",
        |s| s == "3 3 2 1",
    );
    converge(
        &kube,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
        "3 pods bound to box-a",
        |s| s.split_whitespace().filter(|n| *n == "box-a").count() == 3,
    );
    // From here on no replacement becomes ready (box-a is cordoned by the drain, and nothing
    // else would run them), as on a one-node edge box.
    drop(kubelet);
    let before = web_pods_on_box_a(&kube);
    assert_eq!(before.len(), 3, "{before:?}");

    // drain cordons box-a and evicts: the first eviction spends the budget, the others are
    // refused with 429 and retried until the timeout.
    let refused = kube.fails(
        &[
            "drain",
            "box-a",
            "--ignore-daemonsets",
            "--grace-period=0",
            "--timeout=12s",
        ],
        None,
    );
    assert!(
        refused.contains("would violate the pod's disruption budget"),
        "{refused}"
    );
    assert_eq!(
        kube.ok(&[
            "get",
            "node",
            "box-a",
            "-o",
            "jsonpath={.spec.unschedulable}"
        ]),
        "true"
    );
    let after = web_pods_on_box_a(&kube);
    assert_eq!(
        after.len(),
        2,
        "exactly one pod was evicted: {before:?} -> {after:?}"
    );
    assert!(
        after.iter().all(|p| before.contains(p)),
        "{before:?} -> {after:?}"
    );
    converge(
        &kube,
        &[
            "get",
            "pdb",
            "web",
            "-o",
            "jsonpath={.status.currentHealthy} {.status.disruptionsAllowed}",
        ],
        "the budget spent",
        |s| s == "2 0",
    );

    // Without the budget the drain completes.
    kube.ok(&["delete", "pdb", "web"]);
    kube.ok(&[
        "drain",
        "box-a",
        "--ignore-daemonsets",
        "--grace-period=0",
        "--timeout=30s",
    ]);
    assert!(web_pods_on_box_a(&kube).is_empty());
}
