//! The service proxy against the real `nft` and kernel, in two network namespaces of the
//! test's own: a client namespace and a node namespace joined by a veth, the node holding
//! the proxy's table and three endpoint addresses on its loopback, each served by a busybox
//! `httpd` that answers with its own name. The syncer is the real one (`Syncer::sync`,
//! `nft -f -` run with `ip netns exec`).
//!
//! Needs root, `ip`, `nft` and `/bin/busybox`; without them it skips with a line, except
//! under `CI=true`, where a missing tool fails it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use skerry_net::proxy::{Family, Nft, RuleConfig, Syncer};

const BUSYBOX: &str = "/bin/busybox";
/// New connections in the split test (the brief's ~3,000: ~1,000 per endpoint, where a
/// 10 % imbalance is already far outside chance).
const CONNECTIONS: usize = 3000;
/// Chi-square critical value for 2 degrees of freedom at p = 0.001: a uniform split fails
/// this one time in a thousand.
const CHI2_CRIT_DF2_P001: f64 = 13.816;
const CLUSTER_IP: &str = "10.96.0.10";
const STREAM_IP: &str = "10.96.0.20";
const COPY_IP: &str = "10.96.0.30";
const NODE_IP: &str = "192.168.77.2";
const CLIENT_IP: &str = "192.168.77.1";
const NODE_PORT: u16 = 30080;
const ENDPOINTS: [&str; 3] = ["10.244.1.1", "10.244.1.2", "10.244.1.3"];

fn missing(why: &str, ok: bool) -> bool {
    if !ok {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipping: {why}");
    }
    !ok
}

fn tool(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The namespaces and server processes, removed on drop (also on panic).
struct Net {
    client: String,
    node: String,
    servers: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.servers {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.client, &self.node] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

impl Net {
    fn new() -> Net {
        let prefix = format!("pxt{}", std::process::id());
        let client = format!("{prefix}c");
        let node = format!("{prefix}n");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut net = Net {
            client: client.clone(),
            node: node.clone(),
            servers: Vec::new(),
            _dir: dir,
        };
        let veth = format!("{prefix}v");
        sh(&format!(
            "ip netns add {client} && ip netns add {node} && \
             ip link add {veth}a netns {client} type veth peer name {veth}b netns {node} && \
             ip -n {client} addr add {CLIENT_IP}/24 dev {veth}a && ip -n {client} link set {veth}a up && \
             ip -n {client} link set lo up && ip -n {client} route add 10.96.0.0/16 via {NODE_IP} && \
             ip -n {node} addr add {NODE_IP}/24 dev {veth}b && ip -n {node} link set {veth}b up && \
             ip -n {node} link set lo up"
        ));
        for (i, ep) in ENDPOINTS.iter().enumerate() {
            sh(&format!("ip -n {node} addr add {ep}/32 dev lo"));
            let root = net._dir.path().join(format!("ep{i}"));
            std::fs::create_dir_all(&root).expect("mkdir");
            std::fs::write(root.join("index.html"), format!("ep{i}\n")).expect("write");
            let child = Command::new("ip")
                .args(["netns", "exec", &node, BUSYBOX, "httpd", "-f", "-p"])
                .arg(format!("{ep}:8080"))
                .arg("-h")
                .arg(&root)
                .spawn()
                .expect("httpd");
            net.servers.push(child);
        }
        // A stream of 40 lines, 100 ms apart, on port 9000 of the first endpoint.
        let script = net._dir.path().join("stream.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\ni=1\nwhile [ $i -le 40 ]; do echo line$i; i=$((i+1)); sleep 0.1; done\n",
        )
        .expect("write");
        sh(&format!("chmod +x {}", script.display()));
        let child = Command::new("ip")
            .args([
                "netns", "exec", &node, BUSYBOX, "nc", "-l", "-p", "9000", "-e",
            ])
            .arg(&script)
            .spawn()
            .expect("nc");
        net.servers.push(child);
        std::thread::sleep(Duration::from_millis(300));
        net
    }

    fn in_node(&self, cmd: &str) -> String {
        sh(&format!("ip netns exec {} {cmd}", self.node))
    }

    /// `n` HTTP GETs from the client namespace, one new connection each; the bodies.
    fn gets(&self, url: &str, n: usize) -> Vec<String> {
        let out = sh(&format!(
            "ip netns exec {} sh -c 'i=0; while [ $i -lt {n} ]; do {BUSYBOX} wget -qO- {url} || echo FAIL; i=$((i+1)); done'",
            self.client
        ));
        out.lines().map(str::to_string).collect()
    }
}

fn service(name: &str, ip: &str, port: u16, extra: serde_json::Value) -> Service {
    let mut spec = json!({
        "clusterIP": ip, "clusterIPs": [ip],
        "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}],
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name},
        "spec": spec,
    }))
    .expect("service")
}

fn slice(svc: &str, port: u16, ips: &[&str]) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": format!("{svc}-abc"),
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "n1"})).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }))
    .expect("slice")
}

fn counts(bodies: &[String]) -> [usize; 3] {
    let mut c = [0; 3];
    for b in bodies {
        match b.as_str() {
            "ep0" => c[0] += 1,
            "ep1" => c[1] += 1,
            "ep2" => c[2] += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    c
}

#[test]
fn proxy_programs_a_real_table() {
    let ok = rustix_free_is_root() && tool("ip") && tool("nft") && Path::new(BUSYBOX).exists();
    if missing("the proxy test needs root, ip, nft and /bin/busybox", ok) {
        return;
    }
    let net = Net::new();
    // Another program's table, made before the proxy: it must come out byte for byte.
    net.in_node(
        "nft -f - <<'EOF'\ntable inet other {\n set s { type ipv4_addr; elements = { 192.0.2.1 }; }\n chain c { ip saddr @s drop; }\n}\nEOF",
    );
    let other_before = net.in_node("nft list table inet other");

    let nft = Nft::new(vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        net.node.clone(),
        "nft".into(),
    ]);
    let cfg = RuleConfig {
        node_ips: vec![NODE_IP.parse().expect("ip")],
        cluster_cidr: Some("10.244.0.0/16".into()),
        zone: None,
    };
    let mut syncer = Syncer::new(Family::V4, cfg, "n1".into(), nft.clone());
    let web = service(
        "web",
        CLUSTER_IP,
        80,
        json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": NODE_PORT}]}),
    );
    assert!(syncer.update_service(None, Some(&web)));
    assert!(syncer.update_slice("default/web-abc", Some(&slice("web", 8080, &ENDPOINTS))));
    let stream = service("stream", STREAM_IP, 9000, json!({}));
    syncer.update_service(None, Some(&stream));
    syncer.update_slice(
        "default/stream-abc",
        Some(&slice("stream", 9000, &ENDPOINTS[..1])),
    );
    let report = syncer.sync().expect("first sync");
    assert!(report.full, "the first sync is full");
    // A full sync finds the old per-Service chains by these names (to flush and later delete).
    let (chains, sets) = nft.list_names(Family::V4);
    assert!(
        chains
            .iter()
            .any(|c| c.starts_with("service-") && c.ends_with("default/web/tcp/http")),
        "{chains:?}"
    );
    assert!(
        chains.contains("services") && sets.contains("nodeport-ips"),
        "{chains:?} {sets:?}"
    );

    // 1. The ClusterIP splits new connections evenly over the three endpoints.
    let bodies = net.gets(&format!("http://{CLUSTER_IP}/"), CONNECTIONS);
    let c = counts(&bodies);
    let expected = CONNECTIONS as f64 / 3.0;
    let chi2: f64 = c
        .iter()
        .map(|n| (*n as f64 - expected).powi(2) / expected)
        .sum();
    eprintln!("split over {CONNECTIONS} connections: {c:?}, chi-square {chi2:.2}");
    assert!(chi2 < CHI2_CRIT_DF2_P001, "split {c:?}, chi-square {chi2}");

    // 2. The NodePort answers on the node's address.
    let np = net.gets(&format!("http://{NODE_IP}:{NODE_PORT}/"), 6);
    assert_eq!(counts(&np).iter().sum::<usize>(), 6);

    // 3. Session affinity pins the client (a partial sync of one Service).
    let sticky = service(
        "web",
        CLUSTER_IP,
        80,
        json!({"type": "NodePort", "sessionAffinity": "ClientIP",
               "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
               "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": NODE_PORT}]}),
    );
    assert!(syncer.update_service(Some(&web), Some(&sticky)));
    let report = syncer.sync().expect("affinity sync");
    assert!(!report.full, "one changed Service: a partial sync");
    let pinned = counts(&net.gets(&format!("http://{CLUSTER_IP}/"), 30));
    assert_eq!(pinned.iter().filter(|n| **n > 0).count(), 1, "{pinned:?}");

    // 4. An endpoint removed mid-connection: conntrack keeps the connection, no reset.
    let reader = Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.client,
            BUSYBOX,
            "nc",
            STREAM_IP,
            "9000",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("nc client");
    std::thread::sleep(Duration::from_millis(700));
    syncer.update_slice("default/stream-abc", Some(&slice("stream", 9000, &[])));
    syncer.sync().expect("endpoint removal");
    let out = reader.wait_with_output().expect("nc output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l == "line40"),
        "stream cut short: {text:?}"
    );
    // New connections to the Service without endpoints are refused at once.
    let refused = Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.client,
            BUSYBOX,
            "nc",
            "-w",
            "2",
            STREAM_IP,
            "9000",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("nc");
    assert!(
        !refused.status.success(),
        "a Service without endpoints rejects"
    );

    // 5. Drift: someone flushes the table; the next sync notices and rewrites it.
    net.in_node("nft flush table ip skerry-proxy");
    let report = syncer.sync().expect("resync");
    assert!(report.full, "a flushed table triggers a full resync");
    assert_eq!(
        counts(&net.gets(&format!("http://{NODE_IP}:{NODE_PORT}/"), 3))
            .iter()
            .sum::<usize>(),
        3
    );

    // 6. Two Services ask for one address and port (an external IP on web's ClusterIP):
    // nftables refuses a second element with one key and would fail the whole transaction,
    // so the holder keeps it, the newcomer gets the rest of its rules, and the port passes
    // to the newcomer when the holder goes.
    let copy = service("copy", COPY_IP, 80, json!({"externalIPs": [CLUSTER_IP]}));
    syncer.update_service(None, Some(&copy));
    syncer.update_slice(
        "default/copy-abc",
        Some(&slice("copy", 8080, &ENDPOINTS[2..])),
    );
    let report = syncer
        .sync()
        .expect("a clashing Service does not fail the sync");
    assert!(report.full, "a clash is settled in a full sync");
    let ips = net.in_node("nft list map ip skerry-proxy service-ips");
    let held: Vec<&str> = ips
        .split([',', '{', '}'])
        .filter(|e| e.contains(&format!("{CLUSTER_IP} . tcp . 80 ")))
        .collect();
    assert_eq!(held.len(), 1, "{ips}");
    assert!(
        held[0].contains("default/web/"),
        "web keeps its port: {ips}"
    );
    assert_eq!(
        counts(&net.gets(&format!("http://{COPY_IP}/"), 3)),
        [0, 0, 3],
        "the newcomer's own ClusterIP works"
    );

    // 7. The last Services deleted: after the stale-chain delay the table holds nothing of them.
    syncer.update_service(Some(&sticky), None);
    syncer.update_service(Some(&stream), None);
    syncer.update_slice("default/web-abc", None);
    syncer.update_slice("default/stream-abc", None);
    syncer.sync().expect("deletion");
    assert_eq!(
        counts(&net.gets(&format!("http://{CLUSTER_IP}/"), 3)),
        [0, 0, 3],
        "the external IP passed to copy"
    );
    syncer.update_service(Some(&copy), None);
    syncer.update_slice("default/copy-abc", None);
    syncer.sync().expect("deletion of copy");
    std::thread::sleep(Duration::from_millis(1100));
    syncer.sync().expect("stale chains deleted");
    let table = net.in_node("nft list table ip skerry-proxy");
    assert!(
        !table.contains('/'),
        "per-Service chains or sets left:\n{table}"
    );
    assert!(!table.contains("goto"), "map elements left:\n{table}");
    assert!(!table.contains("affinity-"), "{table}");

    assert_eq!(net.in_node("nft list table inet other"), other_before);
}

/// Whether the test runs as root (uid 0 from `id -u`; no `unsafe` geteuid here).
fn rustix_free_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
