//! The pod network across three boxes (issue 20, "Show it on three boxes"): three network
//! namespaces on one bridge, each running `skerry server` as one Raft member with its node
//! agent and containerd ([`common::boxes`]), and `skerry_net::routes::run` in each box against
//! its own server.
//!
//! What it shows: three Ready Nodes with distinct podCIDRs; a pod on box a reaches busybox
//! httpd pods pinned to boxes b and c by pod IP, and they see the client pod's own IP (host-gw
//! routes, no masquerade inside the cluster range); the same pod reaching an address outside
//! the cluster range (a server on the switch) is seen as box a's address (egress masquerade).
//!
//! Needs root, containerd, runc, catatonit, busybox-static, the CNI plugins, `nsenter`, `ip`
//! and `nft`: a failure under `CI=true`, a skip otherwise.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::boxes::{self, Boxes, OUTSIDE_IP};
use common::kube::tail;
use common::node::{IMAGE, POD_TIMEOUT, missing, missing_prerequisite, running};
use serde_json::{Value, json};
use skerry_node::cni::{self, PodRange};
use skerry_node::containerd::config::cni_bin_dir;

/// The httpd pods' port (each pod has its own network namespace).
const HTTPD_PORT: u16 = 8080;
/// The outside server's port on the switch.
const OUTSIDE_PORT: u16 = 8090;
/// How many times (a second apart) the client pod tries each address: routes are written
/// within one informer event of the Nodes, the slack is for a loaded 2-core machine.
const CLIENT_ATTEMPTS: u32 = 60;
/// How often the outside server polls its stop flag between connections.
const OUTSIDE_POLL: Duration = Duration::from_millis(50);

/// A server on the switch's side answering every request with the address it came from.
struct Outside {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Outside {
    fn start(switch_ns: &str) -> Outside {
        let addr: SocketAddr = format!("{OUTSIDE_IP}:{OUTSIDE_PORT}")
            .parse()
            .expect("addr");
        let listener = boxes::in_ns(switch_ns, || TcpListener::bind(addr).expect("bind"));
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, from)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                        let mut buf = [0u8; 1024];
                        let _ = conn.read(&mut buf);
                        let _ = conn.write_all(
                            format!(
                                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{}\n",
                                from.ip()
                            )
                            .as_bytes(),
                        );
                    }
                    Err(_) => std::thread::sleep(OUTSIDE_POLL),
                }
            }
        });
        Outside {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn wait_pod(boxes: &Boxes, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let out = boxes.kubectl_output(0, &["get", "pod", name, "-o", "json"], None);
        if out.status.success() {
            let pod: Value = serde_json::from_slice(&out.stdout).expect("pod JSON");
            if ok(&pod) {
                return pod;
            }
            assert!(
                Instant::now() < deadline,
                "pod {name} not {what}: {}\n{}",
                pod["status"],
                boxes
                    .boxes
                    .iter()
                    .map(|b| format!("--- {}\n{}", b.name, tail(&b.log_text())))
                    .collect::<String>()
            );
        }
        assert!(Instant::now() < deadline, "pod {name} not found");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An httpd pinned to `node` whose CGI `/cgi-bin/ip` answers the client's address.
fn web_pod(name: &str, node: &str) -> Value {
    let script = format!(
        "mkdir -p /tmp/w/cgi-bin && \
         printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\necho $REMOTE_ADDR\\n' > /tmp/w/cgi-bin/ip && \
         chmod 755 /tmp/w/cgi-bin/ip && exec httpd -f -p {HTTPD_PORT} -h /tmp/w"
    );
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "httpd", "image": IMAGE, "command": ["sh", "-c", script]}]}})
}

#[test]
fn pods_reach_each_other_across_boxes_by_pod_ip_and_leave_masqueraded() {
    if missing_prerequisite()
        || missing(
            "the three-box test needs containernetworking-plugins",
            cni::missing_plugins(&cni_bin_dir()).is_empty(),
        )
        || missing(
            "the three-box test needs nsenter, ip and nft",
            boxes::tools_present(),
        )
    {
        return;
    }
    let mut boxes = Boxes::start();

    // Three Ready Nodes (Boxes::start waited for that), each on its box's address, with
    // distinct pod ranges.
    let nodes = boxes.nodes(0);
    assert_eq!(nodes.len(), 3);
    let mut ranges = Vec::new();
    for (i, b) in boxes.boxes.iter().enumerate() {
        let node = nodes
            .iter()
            .find(|n| n["metadata"]["name"] == b.name.as_str())
            .expect("every box has its Node");
        let internal = node["status"]["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["type"] == "InternalIP")
            .and_then(|a| a["address"].as_str())
            .unwrap_or_default();
        assert_eq!(internal, boxes::box_ip(i));
        let cidr = node["spec"]["podCIDR"].as_str().expect("a podCIDR");
        ranges.push(PodRange::parse(cidr).expect("valid podCIDR"));
    }
    assert!(
        ranges[0] != ranges[1] && ranges[1] != ranges[2] && ranges[0] != ranges[2],
        "{ranges:?}"
    );

    boxes.start_routes();
    let _outside = Outside::start(&boxes.switch.clone());

    boxes.ok(
        0,
        &["apply", "-f", "-"],
        Some(&web_pod("web-b", "b").to_string()),
    );
    boxes.ok(
        0,
        &["apply", "-f", "-"],
        Some(&web_pod("web-c", "c").to_string()),
    );
    let mut web_ips = Vec::new();
    for (name, range) in [("web-b", ranges[1]), ("web-c", ranges[2])] {
        let pod = wait_pod(&boxes, name, "Running", running);
        let ip = pod["status"]["podIP"].as_str().expect("pod IP").to_string();
        assert!(
            range.contains(ip.parse().expect("ip")),
            "{name} {ip} outside {range}"
        );
        web_ips.push(ip);
    }

    let targets = format!(
        "B=http://{}:{HTTPD_PORT}/cgi-bin/ip C=http://{}:{HTTPD_PORT}/cgi-bin/ip O=http://{OUTSIDE_IP}:{OUTSIDE_PORT}/",
        web_ips[0], web_ips[1]
    );
    // Debian's busybox wget crashes with `-T`, hence `timeout` (see pods_network.rs).
    let script = format!(
        "for t in {targets}; do n=${{t%%=*}}; u=${{t#*=}}; ok=; \
         for i in $(seq {CLIENT_ATTEMPTS}); do \
           if r=$(timeout 5 wget -q -O - $u); then echo \"$n $r\"; ok=1; break; fi; sleep 1; \
         done; [ -n \"$ok\" ] || {{ echo \"$n unreachable\"; exit 1; }}; done"
    );
    let client = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"nodeName": "a", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "wget", "image": IMAGE, "command": ["sh", "-c", script]}]}});
    boxes.ok(0, &["apply", "-f", "-"], Some(&client.to_string()));
    let client = wait_pod(&boxes, "client", "finished", |p| {
        p["status"]["phase"] == "Succeeded" || p["status"]["phase"] == "Failed"
    });
    let log_path = boxes.boxes[0].data.join(format!(
        "agent/kubelet/pods-logs/default_client_{}/wget/0.log",
        client["metadata"]["uid"].as_str().unwrap_or_default()
    ));
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    // busybox httpd listens on IPv6 and gives REMOTE_ADDR as `[::ffff:a.b.c.d]`: the IPv4
    // address is what counts.
    let lines: Vec<String> = log
        .lines()
        .filter_map(|l| l.split_once(" stdout F ").map(|(_, text)| text))
        .map(|text| text.replace("[::ffff:", "").replace(']', ""))
        .collect();
    let routes = boxes::in_ns(&boxes.boxes[0].netns.clone(), || {
        std::process::Command::new("ip")
            .args(["route"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    });
    assert_eq!(
        client["status"]["phase"], "Succeeded",
        "{}\nlog: {lines:?}\nbox a's routes:\n{routes}",
        client["status"]
    );
    let client_ip = client["status"]["podIP"].as_str().expect("client pod IP");
    assert!(ranges[0].contains(client_ip.parse().expect("ip")));
    assert_eq!(
        lines,
        vec![
            format!("B {client_ip}"),
            format!("C {client_ip}"),
            format!("O {}", boxes::box_ip(0)),
        ],
        "pods on b and c see the client pod's IP; the outside sees box a's"
    );
}
