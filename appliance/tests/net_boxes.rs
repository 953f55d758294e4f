//! The network across three boxes (issue 20, "Show it on three boxes"): three network
//! namespaces on one bridge, each running `skerry server` as one Raft member with its node
//! agent, its containerd and its network (routes, masquerade, service proxy, localhost
//! NodePorts, cluster DNS) ([`common::boxes`]).
//!
//! What it shows: three Ready Nodes with distinct podCIDRs; a pod on box a reaches busybox
//! httpd pods pinned to boxes b and c by pod IP, and they see the client pod's own IP (host-gw
//! routes, no masquerade inside the cluster range); the same pod reaching an address outside
//! the cluster range (a server on the switch) is seen as box a's address (egress masquerade).
//! Then Services: `web.default.svc.cluster.local` from a pod on box a, 3,000 new connections
//! to the ClusterIP split over three endpoints on boxes b and c (a chi-square test), a
//! NodePort from outside on every box and on box a's loopback, `externalTrafficPolicy: Local`
//! keeping the client's address, ClientIP affinity pinning the client, a headless Service's
//! name giving its pods' IPs and an ExternalName its CNAME; last, a long download through a
//! ClusterIP whose endpoint is taken out of the Service after the first lines finishes whole.
//! Every box is given a resolv.conf naming the switch, where a small resolver answers: a name
//! outside the cluster is forwarded there.
//!
//! Needs root, containerd, runc, catatonit, busybox-static, the CNI plugins, `nsenter`, `ip`
//! and `nft`: a failure under `CI=true`, a skip otherwise.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::boxes::{self, Boxes, HTTPD_PORT, OUTSIDE_IP, output_lines, wait_pod, web_pod};
use common::node::{IMAGE, missing, missing_prerequisite, running};
use serde_json::{Value, json};
use skerry_node::cni::{self, PodRange};
use skerry_node::containerd::config::cni_bin_dir;

/// The outside server's port on the switch.
const OUTSIDE_PORT: u16 = 8090;
/// How many times (a second apart) the client pod tries each address: routes are written
/// within one informer event of the Nodes, the slack is for a loaded 2-core machine.
const CLIENT_ATTEMPTS: u32 = 60;
/// How often the outside server polls its stop flag between connections.
const OUTSIDE_POLL: Duration = Duration::from_millis(50);

/// A server thread on the switch's side, running `step` until dropped (then stopped and
/// joined); each step waits at most [`OUTSIDE_POLL`], so the stop flag is seen promptly.
struct Background {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    fn spawn(mut step: impl FnMut() + Send + 'static) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                step();
            }
        });
        Background {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A server on the switch's side answering every request with the address it came from.
fn outside_http(switch_ns: &str) -> Background {
    let addr: SocketAddr = format!("{OUTSIDE_IP}:{OUTSIDE_PORT}")
        .parse()
        .expect("addr");
    let listener = boxes::in_ns(switch_ns, || TcpListener::bind(addr).expect("bind"));
    listener.set_nonblocking(true).expect("nonblocking");
    Background::spawn(move || match listener.accept() {
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
    })
}

/// The address the site's resolver on the switch gives every name it is asked (TEST-NET-3,
/// RFC 5737): a pod that gets it had its question forwarded out of the cluster.
const OUTSIDE_NAME_IP: [u8; 4] = [203, 0, 113, 7];

/// The site's resolver on the switch (port 53 of [`OUTSIDE_IP`], what the boxes' resolv.conf
/// names): answers any A question with [`OUTSIDE_NAME_IP`] and any other with no records.
/// Hand-written DNS (RFC 1035 section 4): the header, the question copied, one answer that
/// points back at the question's name.
fn outside_dns(switch_ns: &str) -> Background {
    let socket = boxes::in_ns(switch_ns, || {
        std::net::UdpSocket::bind(format!("{OUTSIDE_IP}:53")).expect("bind :53")
    });
    socket
        .set_read_timeout(Some(OUTSIDE_POLL))
        .expect("timeout");
    let mut buf = [0u8; 512];
    Background::spawn(move || {
        if let Ok((n, from)) = socket.recv_from(&mut buf)
            && let Some(answer) = dns_answer(&buf[..n])
        {
            let _ = socket.send_to(&answer, from);
        }
    })
}

/// The reply to one query: `None` for anything but one question.
fn dns_answer(query: &[u8]) -> Option<Vec<u8>> {
    if query.len() < 12 || query[4..6] != [0, 1] {
        return None;
    }
    // The question's name: labels up to the zero byte, then type and class.
    let mut at = 12;
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1 + len;
        if len == 0 {
            break;
        }
    }
    let question = query.get(12..at + 4)?;
    let qtype = u16::from_be_bytes([query[at], query[at + 1]]);
    let a = qtype == 1;
    let mut out = Vec::with_capacity(question.len() + 28);
    out.extend_from_slice(&query[0..2]);
    // QR, the query's RD, RA; NOERROR.
    out.extend_from_slice(&[0x80 | (query[2] & 0x01), 0x80]);
    out.extend_from_slice(&[0, 1, 0, u8::from(a), 0, 0, 0, 0]);
    out.extend_from_slice(question);
    if a {
        // Name: a pointer to offset 12; type A, class IN, TTL 60, four bytes.
        out.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        out.extend_from_slice(&OUTSIDE_NAME_IP);
    }
    Some(out)
}

#[test]
fn three_boxes_route_pods_serve_services_and_resolve_names() {
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
    let boxes = Boxes::start();

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

    let _outside = outside_http(&boxes.switch.clone());
    let _outside_dns = outside_dns(&boxes.switch.clone());

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
    let (client, lines) = boxes::run_on_a(&boxes, "client", &script);
    let routes = boxes.routes(0);
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

    services_and_names(&boxes, ranges[0]);
    endpoint_removed_mid_stream(&boxes);
}

/// Lines the stream pod sends, one per [`STREAM_INTERVAL`]: 10 s in all, time enough to take
/// its endpoint away after the first lines and see the proxies synced before the last.
const STREAM_LINES: u32 = 40;
/// See [`STREAM_LINES`] (busybox `sleep` takes fractions).
const STREAM_INTERVAL: &str = "0.25";

/// A long download through a ClusterIP from a pod on box a to a pod on box b, whose endpoint
/// is removed (the pod relabelled out of the selector, its process left running) after the
/// first lines: every box's proxy drops it from the Service, yet the connection already
/// made keeps going to the end, as conntrack holds its translation.
fn endpoint_removed_mid_stream(boxes: &Boxes) {
    let script = format!(
        "printf '#!/bin/sh\\ni=1; while [ $i -le {STREAM_LINES} ]; do echo line$i; i=$((i+1)); sleep {STREAM_INTERVAL}; done\\n' > /tmp/stream && \
         chmod 755 /tmp/stream && while true; do nc -l -p 9000 -e /tmp/stream; done"
    );
    let server = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "stream-b", "labels": {"app": "stream"}},
        "spec": {"nodeName": "b", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "nc", "image": IMAGE, "command": ["sh", "-c", script]}]}});
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "stream"},
        "spec": {"selector": {"app": "stream"}, "ports": [{"port": 9000}]}});
    boxes.ok(0, &["apply", "-f", "-"], Some(&server.to_string()));
    boxes.ok(0, &["apply", "-f", "-"], Some(&service.to_string()));
    wait_pod(boxes, "stream-b", "Running", running);
    let client_script = format!(
        "for i in $(seq {CLIENT_ATTEMPTS}); do \
           timeout 30 nc stream.default.svc.cluster.local 9000 | tee /tmp/o; \
           grep -q line{STREAM_LINES} /tmp/o && exit 0; sleep 1; \
         done; exit 1"
    );
    let client = boxes::client_pod("stream-client", &client_script);
    boxes.ok(0, &["apply", "-f", "-"], Some(&client.to_string()));
    let pod = wait_pod(boxes, "stream-client", "started", |p| {
        p["metadata"]["uid"].is_string()
    });
    let deadline = Instant::now() + SERVICE_TIMEOUT;
    while !output_lines(boxes, "stream-client", &pod).contains(&"line3".to_string()) {
        assert!(Instant::now() < deadline, "the stream never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    boxes.ok(
        0,
        &["label", "pod", "stream-b", "app=elsewhere", "--overwrite"],
        None,
    );
    let cluster_ip = boxes
        .ok(
            0,
            &["get", "svc", "stream", "-o", "jsonpath={.spec.clusterIP}"],
            None,
        )
        .trim()
        .to_string();
    // Box a's proxy (the client's) has the Service without endpoints: in the map of
    // rejections, out of the map of Services.
    let netns = boxes.boxes[0].netns.clone();
    let key = format!("{cluster_ip} . tcp . 9000 ");
    loop {
        let (ips, rejects) = boxes::in_ns(&netns, || {
            let list = |map: &str| {
                std::process::Command::new("nft")
                    .args(["list", "map", "ip", "skerry-proxy", map])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
            };
            (list("service-ips"), list("no-endpoint-services"))
        });
        if !ips.contains(&key) && rejects.contains(&key) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the endpoint never left box a's proxy:\n{ips}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let lines = output_lines(boxes, "stream-client", &pod);
    assert!(
        !lines.contains(&format!("line{STREAM_LINES}")),
        "the stream ended before its endpoint was gone: nothing shown"
    );
    let done = wait_pod(boxes, "stream-client", "finished", |p| {
        p["status"]["phase"] == "Succeeded" || p["status"]["phase"] == "Failed"
    });
    let lines = output_lines(boxes, "stream-client", &done);
    assert_eq!(
        done["status"]["phase"], "Succeeded",
        "the download was cut: {lines:?}"
    );
    let last: Vec<&String> = lines
        .iter()
        .rev()
        .take(STREAM_LINES as usize)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let expected: Vec<String> = (1..=STREAM_LINES).map(|i| format!("line{i}")).collect();
    assert_eq!(
        last.into_iter().cloned().collect::<Vec<_>>(),
        expected,
        "every line, in order, on the connection made before the endpoint left"
    );
}

/// New connections a pod opens to the ClusterIP, over 3 endpoints.
const CONNECTIONS: usize = 3_000;
/// The chi-square bound for 2 degrees of freedom at p = 0.001: a fair split fails this one
/// time in a thousand.
const CHI_SQUARE_P001_DF2: f64 = 13.82;
/// Connections of one client to the ClientIP-affine Service.
const STICKY_CONNECTIONS: usize = 20;
/// How long a Service gets to answer through every box's proxy.
const SERVICE_TIMEOUT: Duration = Duration::from_secs(90);

/// The Services of the scene: a ClusterIP found by name from a pod on box a and
/// spread evenly over three endpoints on boxes b and c; NodePorts answering on every box's
/// address and on a box's loopback; `externalTrafficPolicy: Local` keeping the client's IP
/// where Cluster masquerades; ClientIP affinity pinning a client; a headless Service's name
/// giving its pods' IPs and an ExternalName its CNAME.
fn services_and_names(boxes: &Boxes, client_range: PodRange) {
    boxes.ok(
        0,
        &["apply", "-f", "-"],
        Some(&web_pod("web-c2", "c").to_string()),
    );
    wait_pod(boxes, "web-c2", "Running", running);
    let port = |name: &str, extra: Value| {
        let mut spec = json!({"selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": HTTPD_PORT}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})
    };
    let services = json!({"apiVersion": "v1", "kind": "List", "items": [
        port("web", json!({})),
        port("web-np", json!({"type": "NodePort"})),
        port("web-local", json!({"type": "NodePort", "externalTrafficPolicy": "Local"})),
        port("web-sticky", json!({"sessionAffinity": "ClientIP"})),
        port("web-h", json!({"clusterIP": "None"})),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext"},
         "spec": {"type": "ExternalName", "externalName": "example.org"}},
    ]});
    boxes.ok(0, &["apply", "-f", "-"], Some(&services.to_string()));
    let node_port = |name: &str| -> u16 {
        boxes
            .ok(
                0,
                &[
                    "get",
                    "svc",
                    name,
                    "-o",
                    "jsonpath={.spec.ports[0].nodePort}",
                ],
                None,
            )
            .trim()
            .parse()
            .expect("a node port")
    };
    let (np, local) = (node_port("web-np"), node_port("web-local"));
    let cluster_ip = boxes
        .ok(
            0,
            &["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"],
            None,
        )
        .trim()
        .to_string();

    // NodePorts from outside the cluster (the switch), on every box.
    for i in 0..3 {
        let from = http_in(
            &boxes.switch,
            &format!("{}:{np}", boxes::box_ip(i)),
            "/cgi-bin/ip",
        );
        // Masqueraded by the box the client came through: its address on the segment, or on
        // its pod bridge when the endpoint picked is on that box itself.
        assert!(
            from == boxes::box_ip(i) || from.starts_with("10.42."),
            "policy Cluster: the endpoint sees box {i}, not the client: {from}"
        );
    }
    let from = http_in(
        &boxes.switch,
        &format!("{}:{local}", boxes::box_ip(1)),
        "/cgi-bin/ip",
    );
    assert_eq!(from, OUTSIDE_IP, "policy Local keeps the client's address");
    // A NodePort on a box's loopback (the userspace proxy: nftables cannot DNAT there).
    let netns = boxes.boxes[0].netns.clone();
    let name = http_in(&netns, &format!("127.0.0.1:{np}"), "/cgi-bin/who");
    assert!(name.starts_with("web-"), "{name}");

    // From a pod on box a: the name, the split, the affinity, the records.
    let script = format!(
        "for i in $(seq {CLIENT_ATTEMPTS}); do \
           if r=$(timeout 5 wget -q -O - http://web.default.svc.cluster.local/cgi-bin/ip); then echo \"N $r\"; break; fi; sleep 1; \
         done; \
         i=0; while [ $i -lt {CONNECTIONS} ]; do echo \"W $(timeout 5 wget -q -O - http://{cluster_ip}/cgi-bin/who)\"; i=$((i+1)); done; \
         i=0; while [ $i -lt {STICKY_CONNECTIONS} ]; do echo \"S $(timeout 5 wget -q -O - http://web-sticky/cgi-bin/who)\"; i=$((i+1)); done; \
         nslookup web-h.default.svc.cluster.local | sed 's/^/H /'; \
         nslookup -type=cname ext.default.svc.cluster.local | sed 's/^/E /'; \
         nslookup -type=a outside.example. | sed 's/^/F /'; true"
    );
    let (pod, lines) = boxes::run_on_a(boxes, "svc-client", &script);
    let tagged = |tag: &str| -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(tag))
            .map(|l| l.trim().to_string())
            .collect()
    };
    let client_ip = pod["status"]["podIP"].as_str().unwrap_or_default();
    assert!(client_range.contains(client_ip.parse().expect("pod IP")));
    assert_eq!(
        tagged("N "),
        vec![client_ip.to_string()],
        "web.default.svc.cluster.local answers, and the endpoint sees the pod's own IP: {:?}",
        &lines[..lines.len().min(20)]
    );
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for who in tagged("W ") {
        *counts.entry(who).or_default() += 1;
    }
    assert_eq!(
        counts.keys().cloned().collect::<Vec<_>>(),
        vec!["web-b", "web-c", "web-c2"],
        "every connection answered by one of the three endpoints: {counts:?}"
    );
    let expected = CONNECTIONS as f64 / 3.0;
    let chi: f64 = counts
        .values()
        .map(|&n| (n as f64 - expected).powi(2) / expected)
        .sum();
    assert!(
        chi < CHI_SQUARE_P001_DF2,
        "{CONNECTIONS} connections split {counts:?}: chi-square {chi:.2}"
    );
    eprintln!("{CONNECTIONS} connections over 3 endpoints: {counts:?}, chi-square {chi:.2}");
    let sticky = tagged("S ");
    assert_eq!(sticky.len(), STICKY_CONNECTIONS);
    assert!(
        sticky.iter().all(|s| s == &sticky[0]) && sticky[0].starts_with("web-"),
        "ClientIP affinity pins the client to one endpoint: {sticky:?}"
    );
    let headless = tagged("H ").join("\n");
    let web_ips: Vec<String> = ["web-b", "web-c", "web-c2"]
        .iter()
        .map(|n| {
            boxes
                .ok(
                    0,
                    &["get", "pod", n, "-o", "jsonpath={.status.podIP}"],
                    None,
                )
                .trim()
                .to_string()
        })
        .collect();
    for ip in &web_ips {
        assert!(
            headless.contains(ip.as_str()),
            "headless answers {ip}:\n{headless}"
        );
    }
    let forwarded = tagged("F ").join("\n");
    let outside_ip = OUTSIDE_NAME_IP.map(|b| b.to_string()).join(".");
    assert!(
        forwarded.contains(&outside_ip),
        "a name outside the cluster is forwarded to the site's resolver:\n{forwarded}"
    );
    let cname = tagged("E ").join("\n");
    assert!(
        cname.contains("example.org"),
        "ExternalName's CNAME:\n{cname}"
    );
}

/// An HTTP GET of `path` from inside network namespace `ns`, retried until it answers (a new
/// Service takes a sync of every box's proxy); the body, trimmed, without IPv4-mapped
/// brackets.
fn http_in(ns: &str, addr: &str, path: &str) -> String {
    let deadline = Instant::now() + SERVICE_TIMEOUT;
    let (addr, path) = (addr.to_string(), path.to_string());
    loop {
        let (a, p) = (addr.clone(), path.clone());
        let answer = boxes::in_ns(ns, move || -> std::io::Result<String> {
            let addr: SocketAddr = a.parse().map_err(std::io::Error::other)?;
            let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            conn.set_read_timeout(Some(Duration::from_secs(5)))?;
            conn.write_all(format!("GET {p} HTTP/1.0\r\n\r\n").as_bytes())?;
            let mut text = String::new();
            conn.read_to_string(&mut text)?;
            Ok(text)
        });
        if let Ok(text) = &answer
            && text.starts_with("HTTP/1.")
            && text.contains(" 200 ")
            && let Some(body) = text.lines().rev().find(|l| !l.trim().is_empty())
        {
            // The body is one line (busybox's CGI ends its headers with bare newlines).
            return body.trim().replace("[::ffff:", "").replace(']', "");
        }
        assert!(
            Instant::now() < deadline,
            "{addr}{path} in {ns}: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
