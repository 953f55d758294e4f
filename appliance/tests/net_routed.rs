//! Three boxes on two sites (issue 20: "a VXLAN overlay for boxes that do not share a
//! segment"): boxes a and b on one segment, box c on another, the switch namespace routing
//! between the two and knowing no pod range ([`common::boxes::Layout::ThirdBehindRouter`]).
//! Each box runs `skerry server` with its node agent and its network, as in `net_boxes.rs`.
//!
//! What it shows: the Raft cluster forms across the router; box a routes b's pod range
//! directly (host-gw) and c's through the VXLAN device; a pod on box a reaches pods on b and
//! c by pod IP and both see the client pod's own IP; a Service named from box a spreads over
//! endpoints on both sides of the router.
//!
//! Needs what `net_boxes.rs` needs: a failure under `CI=true`, a skip otherwise.

mod common;

use common::boxes::{self, Boxes, FAR_BOX_IP, HTTPD_PORT, Layout, wait_pod, web_pod};
use common::node::{missing, missing_prerequisite, running};
use serde_json::json;
use skerry_node::cni::{self, PodRange};
use skerry_node::containerd::config::cni_bin_dir;

/// How many times (a second apart) the client pod tries each address (routes and entries
/// follow the Nodes within an informer event; the slack is for a loaded 2-core machine).
const CLIENT_ATTEMPTS: u32 = 60;
/// New connections to the Service from the client pod: enough that both sides of the router
/// answer (the chance that 30 fair picks over 2 endpoints miss one is 2 in a billion).
const SERVICE_CONNECTIONS: usize = 30;

#[test]
fn a_box_behind_a_router_is_reached_through_the_overlay() {
    if missing_prerequisite()
        || missing(
            "the routed-boxes test needs containernetworking-plugins",
            cni::missing_plugins(&cni_bin_dir()).is_empty(),
        )
        || missing(
            "the routed-boxes test needs nsenter, ip and nft",
            boxes::tools_present(),
        )
    {
        return;
    }
    let boxes = Boxes::start_with(Layout::ThirdBehindRouter);
    assert_eq!(boxes.boxes[2].ip, FAR_BOX_IP);

    let nodes = boxes.nodes(0);
    let range_of = |name: &str| -> PodRange {
        let node = nodes
            .iter()
            .find(|n| n["metadata"]["name"] == name)
            .expect("every box has its Node");
        PodRange::parse(node["spec"]["podCIDR"].as_str().expect("a podCIDR")).expect("range")
    };
    let ranges = [range_of("a"), range_of("b"), range_of("c")];

    for (name, node) in [("web-b", "b"), ("web-c", "c")] {
        boxes.ok(
            0,
            &["apply", "-f", "-"],
            Some(&web_pod(name, node).to_string()),
        );
    }
    let mut web_ips = Vec::new();
    for (name, range) in [("web-b", ranges[1]), ("web-c", ranges[2])] {
        let pod = wait_pod(&boxes, name, "Running", running);
        let ip = pod["status"]["podIP"].as_str().expect("pod IP").to_string();
        assert!(range.contains(ip.parse().expect("ip")), "{name} {ip}");
        web_ips.push(ip);
    }
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": HTTPD_PORT}]}});
    boxes.ok(0, &["apply", "-f", "-"], Some(&service.to_string()));

    let script = format!(
        "for t in B=http://{b}:{HTTPD_PORT}/cgi-bin/ip C=http://{c}:{HTTPD_PORT}/cgi-bin/ip; do \
           n=${{t%%=*}}; u=${{t#*=}}; ok=; \
           for i in $(seq {CLIENT_ATTEMPTS}); do \
             if r=$(timeout 5 wget -q -O - $u); then echo \"$n $r\"; ok=1; break; fi; sleep 1; \
           done; [ -n \"$ok\" ] || {{ echo \"$n unreachable\"; exit 1; }}; done; \
         for i in $(seq {CLIENT_ATTEMPTS}); do \
           if timeout 5 wget -q -O - http://web.default.svc.cluster.local/cgi-bin/who >/dev/null; then break; fi; sleep 1; \
         done; \
         i=0; while [ $i -lt {SERVICE_CONNECTIONS} ]; do echo \"W $(timeout 5 wget -q -O - http://web/cgi-bin/who)\"; i=$((i+1)); done",
        b = web_ips[0],
        c = web_ips[1],
    );
    let (client, lines) = boxes::run_on_a(&boxes, "client", &script);
    let routes = boxes.routes(0);
    assert_eq!(
        client["status"]["phase"], "Succeeded",
        "{}\nlog: {lines:?}\nbox a's routes:\n{routes}",
        client["status"]
    );
    // Box a: b's range through b's address, c's through the tunnel.
    let route_to = |range: PodRange| {
        routes
            .lines()
            .find(|l| l.starts_with(&range.to_string()))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        route_to(ranges[1]).contains(&format!("via {} dev eth0", boxes.boxes[1].ip)),
        "{routes}"
    );
    assert!(
        route_to(ranges[2]).contains("dev skerry-vxlan") && route_to(ranges[2]).contains("onlink"),
        "{routes}"
    );

    let client_ip = client["status"]["podIP"].as_str().expect("client pod IP");
    assert!(ranges[0].contains(client_ip.parse().expect("ip")));
    let seen: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("B ") || l.starts_with("C "))
        .collect();
    assert_eq!(
        seen,
        [&format!("B {client_ip}"), &format!("C {client_ip}")],
        "pods on b (same segment) and c (behind the router) see the client pod's own IP"
    );
    let answers: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("W "))
        .map(str::trim)
        .collect();
    assert_eq!(
        answers.into_iter().collect::<Vec<_>>(),
        ["web-b", "web-c"],
        "the Service answers from both sides of the router: {lines:?}"
    );
}
