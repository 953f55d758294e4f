//! Pods on the pod network, for real: the real `skerry server` with its node agent and its
//! default flags (nodeipam gives the node a /24 of `--cluster-cidr`, `skerry_node::cni` writes
//! the conflist into containerd's conf dir, the runtime reports NetworkReady), the real
//! kubectl and curl, and the Debian CNI plugins (`bridge`, `host-local`, `portmap`).
//!
//! What it shows: a pod's IP is in the node's podCIDR, two pods reach each other by pod IP,
//! the host reaches a pod IP, a `hostPort` answers on the node's address, and deleting the
//! pods releases their addresses in host-local's reservations. The bridge (`cni0`) and the
//! `portmap` chains the plugins leave on the host are removed when the test ends.
//!
//! Needs root, containerd, runc, catatonit, busybox-static and the CNI plugins: a failure
//! under `CI=true`, a skip otherwise.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::free_port;
use common::kube::tail;
use common::node::{
    IMAGE, Node, POD_TIMEOUT, PluginLeftovers, missing, missing_prerequisite, running,
};
use serde_json::{Value, json};
use skerry_node::cni;
use skerry_node::containerd::config::cni_bin_dir;

const NODE: &str = "podnet-node";
/// The port the test's httpd listens on inside its pod's own network namespace: any port
/// works there, the pod has the namespace to itself.
const HTTPD_PORT: u16 = 8080;

fn pod_ip(p: &Value) -> Option<&str> {
    p["status"]["podIP"].as_str()
}

/// GETs `url` with curl until it answers (the pod's httpd starts a moment after Running).
fn curl_until(url: &str) -> String {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "5", url])
            .output()
            .expect("curl");
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// host-local's reservations: one file per address under `<dataDir>/<network>/`.
fn reserved_ips(node: &Node) -> Vec<String> {
    let dir = node
        .data()
        .join("agent/kubelet/cni/networks")
        .join(cni::NETWORK_NAME);
    let mut ips: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    ips.sort();
    ips
}

#[test]
fn pods_get_pod_ips_reach_each_other_and_release_them() {
    if missing_prerequisite()
        || missing(
            "pod network tests need containernetworking-plugins",
            cni::missing_plugins(&cni_bin_dir()).is_empty(),
        )
    {
        return;
    }
    // Declared before the node, so dropped after it: the plugins' leftovers go once the
    // node has stopped and its pods are gone.
    let _leftovers = PluginLeftovers;
    let node = Node::start(NODE);
    node.import_busybox();
    let range = node.wait_pod_network();

    // A web server on the pod network, with a hostPort.
    let host_port = free_port();
    let web = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "httpd", "image": IMAGE,
                "command": ["busybox", "httpd", "-f", "-p", HTTPD_PORT.to_string(), "-h", "/etc"],
                "ports": [{"containerPort": HTTPD_PORT, "hostPort": host_port}]}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&web.to_string()));
    let web = node.wait_pod("web", "Running", running);
    let web_ip = pod_ip(&web).expect("running").to_string();
    let host_ip = web["status"]["hostIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_ne!(web_ip, host_ip, "not the host network");
    assert!(
        range.contains(web_ip.parse().expect("an IP")),
        "{web_ip} outside the node's podCIDR {range}"
    );
    assert_ne!(
        web_ip,
        range.gateway().to_string(),
        "the gateway is the bridge's"
    );
    assert_eq!(web["status"]["podIPs"], json!([{"ip": web_ip}]));
    assert_eq!(reserved_ips(&node), vec![web_ip.clone()]);

    // The host reaches the pod's IP through the bridge; the pod's /etc/hosts names it.
    let hosts = curl_until(&format!("http://{web_ip}:{HTTPD_PORT}/hosts"));
    assert!(
        hosts.starts_with("# Kubernetes-managed hosts file."),
        "{hosts}"
    );
    assert!(hosts.contains(&format!("{web_ip}\tweb")), "{hosts}");

    // The hostPort answers on the node's address (portmap's DNAT).
    let by_port = curl_until(&format!("http://{host_ip}:{host_port}/hosts"));
    assert_eq!(by_port, hosts);

    // A second pod reaches the first by pod IP: busybox wget, its output in the pod's log.
    // (Debian's busybox 1.35 wget crashes with `-T`, hence `timeout`.)
    let client = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "wget", "image": IMAGE,
                "command": ["sh", "-c", format!(
                    "for i in $(seq 30); do timeout 5 wget -q -O - http://{web_ip}:{HTTPD_PORT}/hosts && exit 0; sleep 1; done; exit 1")]}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&client.to_string()));
    let client = node.wait_pod("client", "Succeeded", |p| {
        p["status"]["phase"] == "Succeeded" || p["status"]["phase"] == "Failed"
    });
    let m = &client["metadata"];
    let log_path = node.data().join(format!(
        "agent/kubelet/pods-logs/default_client_{}/wget/0.log",
        m["uid"].as_str().unwrap_or_default()
    ));
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert_eq!(
        client["status"]["phase"], "Succeeded",
        "{}\n{log}",
        client["status"]
    );
    let client_ip = pod_ip(&client).unwrap_or_default().to_string();
    assert!(
        range.contains(client_ip.parse().expect("an IP")) && client_ip != web_ip,
        "client {client_ip}, web {web_ip}"
    );
    assert!(
        log.contains(&format!("stdout F {web_ip}\tweb")),
        "{}: {log}",
        log_path.display()
    );

    // Deleting the pods tears their sandboxes down: host-local's reservations are gone.
    node.kube
        .ok(&["delete", "pod", "web", "client", "--timeout=60s"]);
    let deadline = Instant::now() + POD_TIMEOUT;
    while !reserved_ips(&node).is_empty() {
        assert!(
            Instant::now() < deadline,
            "addresses still reserved: {:?}\n{}",
            reserved_ips(&node),
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
