//! The route reconciler and the egress masquerade against the real kernel, in network
//! namespaces these tests create (two "boxes" joined by a veth pair, each with a bridge `cni0`
//! and one "pod" namespace on it), driven with Node data given as values.
//!
//! Needs root, `ip` and `nft`: under `CI=true` their absence fails the test, otherwise it
//! skips with a line. Namespaces are named `skr<pid>x<random>-...` and deleted on drop (also
//! on panic); nothing outside them is touched.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use skerry_net::routes::ip::RT_PROTO;
use skerry_net::routes::plan::{Cidr, Peer};
use skerry_net::routes::{Reconciler, RoutesConfig, masq, vxlan};

/// The veth links' MTU (the kernel's default for a veth): the tunnel's is this less
/// [`vxlan::OVERHEAD_V4`].
const LINK_MTU: u32 = 1500;
/// IPv4 and TCP headers without options: an MSS is the MTU less these 40 bytes.
const IPV4_TCP_HEADERS: u32 = 40;
/// How long a test connection may take: everything is local to one kernel.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

fn missing() -> bool {
    let ok = rustix::process::geteuid().is_root()
        && ["ip", "nft"].iter().all(|t| {
            Command::new(t)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        });
    if !ok {
        let why = "route tests need root, ip and nft";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipping: {why}");
    }
    !ok
}

/// Namespaces of one test, deleted on drop.
struct Namespaces {
    prefix: String,
    names: Vec<String>,
}

impl Namespaces {
    fn new() -> Namespaces {
        Namespaces {
            prefix: format!("skr{}x{}", std::process::id() % 100_000, rand_suffix()),
            names: Vec::new(),
        }
    }

    fn add(&mut self, short: &str) -> String {
        let name = format!("{}-{short}", self.prefix);
        sh(&["ip", "netns", "add", &name]);
        self.names.push(name.clone());
        sh(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        name
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn rand_suffix() -> u32 {
    let mut buf = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("urandom");
    u32::from_le_bytes(buf) % 100_000
}

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `f` on a thread of its own that entered network namespace `ns`: sockets it opens and
/// processes it starts live there.
fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
            rustix::thread::move_into_link_name_space(
                file.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns");
            f()
        })
        .join()
        .expect("namespace thread")
    })
}

fn cidr(s: &str) -> Cidr {
    Cidr::parse(s).expect("cidr")
}

fn peer(name: &str, ip: &str, range: &str) -> Peer {
    Peer {
        name: name.into(),
        internal_ips: vec![ip.parse().expect("ip")],
        pod_cidrs: vec![cidr(range)],
    }
}

fn config(name: &str, ip: &str) -> RoutesConfig {
    RoutesConfig {
        node_name: name.into(),
        cluster_cidrs: vec![cidr("10.42.0.0/16")],
        node_ip: ip.parse().expect("ip"),
        link: None,
    }
}

/// `ip -json route` of the namespace's main table as (dst, gateway, protocol).
fn routes(ns: &str) -> Vec<(String, String, String)> {
    let out = sh(&[
        "ip", "-n", ns, "-json", "-4", "route", "show", "table", "main",
    ]);
    let list: Vec<serde_json::Value> = serde_json::from_str(&out).expect("route JSON");
    list.iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("dst"), s("gateway"), s("protocol"))
        })
        .collect()
}

fn ours(ns: &str) -> Vec<(String, String)> {
    routes(ns)
        .into_iter()
        .filter(|r| r.2 == RT_PROTO.to_string())
        .map(|r| (r.0, r.1))
        .collect()
}

/// Gives box `ns` a bridge `cni0` at `gw`/24 and one "pod" namespace `pod` on it at `pod_ip`
/// with its default route through `gw`; returns the pod's namespace.
fn bridge_with_pod(nss: &mut Namespaces, ns: &str, gw: &str, pod: &str, pod_ip: &str) -> String {
    sh(&["ip", "-n", ns, "link", "add", "cni0", "type", "bridge"]);
    sh(&[
        "ip",
        "-n",
        ns,
        "addr",
        "add",
        &format!("{gw}/24"),
        "dev",
        "cni0",
    ]);
    sh(&["ip", "-n", ns, "link", "set", "cni0", "up"]);
    let pns = nss.add(pod);
    sh(&[
        "ip", "-n", &pns, "link", "add", "eth0", "type", "veth", "peer", "name", "vpod", "netns",
        ns,
    ]);
    sh(&[
        "ip", "-n", ns, "link", "set", "vpod", "master", "cni0", "up",
    ]);
    sh(&["ip", "-n", &pns, "addr", "add", pod_ip, "dev", "eth0"]);
    sh(&["ip", "-n", &pns, "link", "set", "eth0", "up"]);
    sh(&["ip", "-n", &pns, "route", "add", "default", "via", gw]);
    pns
}

/// Two boxes `a` (10.77.0.1) and `b` (10.77.0.2) on one veth segment, each with `cni0` over
/// its pod range and one pod (10.42.0.2, 10.42.1.2). Returns (box a, box b, pod a, pod b).
fn two_boxes(nss: &mut Namespaces) -> (String, String, String, String) {
    let (na, nb) = (nss.add("a"), nss.add("b"));
    let mut pods = Vec::new();
    sh(&[
        "ip", "-n", &na, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
        &nb,
    ]);
    for (ns, pod, addr, gw, pod_ip) in [
        (&na, "pa", "10.77.0.1/24", "10.42.0.1", "10.42.0.2/24"),
        (&nb, "pb", "10.77.0.2/24", "10.42.1.1", "10.42.1.2/24"),
    ] {
        sh(&["ip", "-n", ns, "addr", "add", addr, "dev", "eth0"]);
        sh(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
        pods.push(bridge_with_pod(nss, ns, gw, pod, pod_ip));
    }
    let (pa, pb) = (pods[0].clone(), pods[1].clone());
    (na, nb, pa, pb)
}

/// Accepts one connection in `ns` on `addr` and returns the peer address it came from, while
/// `client` runs in `client_ns`. The client's result is returned too.
fn observe(ns: &str, addr: &str, client_ns: &str) -> (Option<IpAddr>, Result<(), String>) {
    let addr: SocketAddr = addr.parse().expect("addr");
    let listener = in_ns(ns, || TcpListener::bind(addr).expect("bind"));
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            listener.set_nonblocking(true).expect("nonblocking accept");
            let deadline = std::time::Instant::now() + CONNECT_TIMEOUT * 2;
            loop {
                match listener.accept() {
                    Ok((mut c, from)) => {
                        let _ = c.write_all(b"hi");
                        return Some(from.ip());
                    }
                    Err(_) if std::time::Instant::now() > deadline => return None,
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        let client = in_ns(client_ns, || {
            let mut c =
                TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| e.to_string())?;
            c.set_read_timeout(Some(CONNECT_TIMEOUT))
                .map_err(|e| e.to_string())?;
            let mut buf = [0u8; 2];
            c.read_exact(&mut buf).map_err(|e| e.to_string())?;
            Ok(())
        });
        // The server waits only if the client got through.
        let seen = server.join().expect("server thread");
        (seen, client)
    })
}

#[test]
fn routes_follow_the_nodes_and_leave_other_routes_alone() {
    if missing() {
        return;
    }
    let mut nss = Namespaces::new();
    let (na, _nb, _pa, _pb) = two_boxes(&mut nss);
    // A stale route of ours from "before a restart", and two routes of someone else's.
    let proto = RT_PROTO.to_string();
    sh(&[
        "ip",
        "-n",
        &na,
        "route",
        "add",
        "10.42.7.0/24",
        "via",
        "10.77.0.7",
        "proto",
        &proto,
    ]);
    sh(&[
        "ip",
        "-n",
        &na,
        "route",
        "add",
        "10.42.9.0/24",
        "via",
        "10.77.0.9",
        "proto",
        "static",
    ]);
    sh(&[
        "ip",
        "-n",
        &na,
        "route",
        "add",
        "10.99.0.0/24",
        "via",
        "10.77.0.99",
        "proto",
        "static",
    ]);
    let reconciler = in_ns(&na, || {
        Reconciler::new(&config("a", "10.77.0.1")).expect("new")
    });
    assert_eq!(reconciler.link(), "eth0");
    let mut peers = vec![
        peer("a", "10.77.0.1", "10.42.0.0/24"),
        peer("b", "10.77.0.2", "10.42.1.0/24"),
        peer("c", "10.77.0.3", "10.42.2.0/24"),
        // Claims a range an administrator's route already covers.
        peer("d", "10.77.0.4", "10.42.9.0/24"),
        // On no subnet of eth0: no host-gw path, the overlay's.
        peer("far", "192.168.200.5", "10.42.5.0/24"),
        // No address of the overlay's family either: no path at all.
        peer("v6", "fd00::5", "10.42.6.0/24"),
    ];
    let sync = |peers: &[Peer]| in_ns(&na, || reconciler.sync_peers(peers).expect("sync"));

    let report = sync(&peers);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        ours(&na),
        vec![
            ("10.42.1.0/24".to_string(), "10.77.0.2".to_string()),
            ("10.42.2.0/24".to_string(), "10.77.0.3".to_string()),
            ("10.42.5.0/24".to_string(), "10.42.5.0".to_string()),
        ],
        "the stale 10.42.7.0/24 is gone, b and c are routed, far through the overlay, self and v6 not"
    );
    assert_eq!(report.plan.foreign, vec![cidr("10.42.9.0/24")]);
    assert_eq!(report.plan.unroutable.len(), 1);
    assert_eq!(report.plan.unroutable[0].node, "v6");
    let all = routes(&na);
    for (dst, gw) in [
        ("10.42.9.0/24", "10.77.0.9"),
        ("10.99.0.0/24", "10.77.0.99"),
    ] {
        assert!(
            all.iter()
                .any(|r| r.0 == dst && r.1 == gw && r.2 == "static"),
            "{dst} via {gw} kept: {all:?}"
        );
    }

    // Nothing changed: nothing to do.
    assert!(sync(&peers).plan.is_empty());

    // c moves to another address; then b is deleted.
    peers[2] = peer("c", "10.77.0.30", "10.42.2.0/24");
    sync(&peers);
    assert_eq!(
        ours(&na),
        vec![
            ("10.42.1.0/24".to_string(), "10.77.0.2".to_string()),
            ("10.42.2.0/24".to_string(), "10.77.0.30".to_string()),
            ("10.42.5.0/24".to_string(), "10.42.5.0".to_string()),
        ]
    );
    peers.remove(1);
    peers.retain(|p| p.name != "far");
    sync(&peers);
    assert_eq!(
        ours(&na),
        vec![("10.42.2.0/24".to_string(), "10.77.0.30".to_string())]
    );

    // A route of ours deleted by hand comes back at the next sync.
    sh(&["ip", "-n", &na, "route", "del", "10.42.2.0/24"]);
    sync(&peers);
    assert_eq!(
        ours(&na),
        vec![("10.42.2.0/24".to_string(), "10.77.0.30".to_string())]
    );
    assert!(routes(&na).iter().any(|r| r.0 == "10.99.0.0/24"));
}

#[test]
fn pods_keep_their_ips_across_boxes_and_leave_masqueraded() {
    if missing() {
        return;
    }
    let mut nss = Namespaces::new();
    let (na, nb, pa, pb) = two_boxes(&mut nss);
    let peers = vec![
        peer("a", "10.77.0.1", "10.42.0.0/24"),
        peer("b", "10.77.0.2", "10.42.1.0/24"),
    ];
    // Another program's nat table in box a, which the masquerade must leave as it is.
    let other = "table ip other-nat {\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat + 10; policy accept;\n\t\tip daddr 203.0.113.0/24 counter masquerade\n\t}\n}\n";
    in_ns(&na, || {
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("nft");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(other.as_bytes())
            .expect("write");
        assert!(child.wait().expect("nft").success());
    });
    let list_other = || in_ns(&na, || sh(&["nft", "list", "table", "ip", "other-nat"]));
    let other_before = list_other();

    // Without routes (and forwarding), pod a cannot reach pod b.
    let (seen, client) = observe(&pb, "10.42.1.2:8080", &pa);
    assert!(client.is_err() && seen.is_none(), "reached pod b unrouted");

    for (ns, name, ip) in [(&na, "a", "10.77.0.1"), (&nb, "b", "10.77.0.2")] {
        in_ns(ns, || {
            let cfg = config(name, ip);
            masq::enable_forwarding(&cfg.cluster_cidrs).expect("forwarding");
            masq::apply(&cfg.cluster_cidrs).expect("masquerade");
            let report = Reconciler::new(&cfg)
                .expect("new")
                .sync_peers(&peers)
                .expect("sync");
            assert!(report.errors.is_empty(), "{:?}", report.errors);
        });
    }

    // Pod to pod across boxes: pod b sees pod a's own address.
    let (seen, client) = observe(&pb, "10.42.1.2:8080", &pa);
    assert_eq!(client, Ok(()));
    assert_eq!(seen, Some("10.42.0.2".parse().expect("ip")));

    // Pod to outside the cluster range (box b's own address): seen as box a's address.
    let (seen, client) = observe(&nb, "10.77.0.2:8081", &pa);
    assert_eq!(client, Ok(()));
    assert_eq!(seen, Some("10.77.0.1".parse().expect("ip")));

    // Applying again is one transaction replacing only our table.
    in_ns(&na, || {
        masq::apply(&[cidr("10.42.0.0/16")]).expect("again");
        assert!(masq::present(&[cidr("10.42.0.0/16")]));
    });
    assert_eq!(list_other(), other_before);
    let ruleset = in_ns(&na, || sh(&["nft", "list", "tables"]));
    assert!(ruleset.contains("table ip skerry-nat"), "{ruleset}");
    assert!(!ruleset.contains("table ip6 skerry-nat"), "{ruleset}");
}

/// Box `a` (10.77.0.1) and box `c` (10.78.0.3) on two segments joined by a router namespace
/// `r` that forwards between them and knows nothing of the pod ranges; each box has `cni0`
/// over its range and one pod (10.42.0.2, 10.42.2.2). Returns (a, c, pod a, pod c, router).
fn boxes_behind_a_router(nss: &mut Namespaces) -> [String; 5] {
    let (na, nc, nr) = (nss.add("a"), nss.add("c"), nss.add("r"));
    sh(&[
        "ip",
        "netns",
        "exec",
        &nr,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);
    let mut pods = Vec::new();
    for (ns, side, addr, router, gw, pod, pod_ip) in [
        (
            &na,
            "ra",
            "10.77.0.1/24",
            "10.77.0.254",
            "10.42.0.1",
            "pa",
            "10.42.0.2/24",
        ),
        (
            &nc,
            "rc",
            "10.78.0.3/24",
            "10.78.0.254",
            "10.42.2.1",
            "pc",
            "10.42.2.2/24",
        ),
    ] {
        sh(&[
            "ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", side, "netns",
            &nr,
        ]);
        sh(&["ip", "-n", ns, "addr", "add", addr, "dev", "eth0"]);
        sh(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
        sh(&["ip", "-n", ns, "route", "add", "default", "via", router]);
        sh(&[
            "ip",
            "-n",
            &nr,
            "addr",
            "add",
            &format!("{router}/24"),
            "dev",
            side,
        ]);
        sh(&["ip", "-n", &nr, "link", "set", side, "up"]);
        pods.push(bridge_with_pod(nss, ns, gw, pod, pod_ip));
    }
    [na, nc, pods[0].clone(), pods[1].clone(), nr]
}

/// The MSS `ss` reports for the one established TCP connection on `port` in namespace `ns`.
fn established_mss(ns: &str, port: u16) -> Option<u32> {
    let out = sh(&[
        "ip",
        "netns",
        "exec",
        ns,
        "ss",
        "-tniH",
        "state",
        "established",
        "sport",
        "=",
        &format!(":{port}"),
    ]);
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("mss:"))
        .and_then(|m| m.parse().ok())
}

#[test]
fn pods_behind_a_router_are_reached_through_the_overlay() {
    if missing() {
        return;
    }
    let mut nss = Namespaces::new();
    let [na, nc, pa, pc, nr] = boxes_behind_a_router(&mut nss);
    let peers = vec![
        peer("a", "10.77.0.1", "10.42.0.0/24"),
        peer("c", "10.78.0.3", "10.42.2.0/24"),
    ];
    let reconcilers: Vec<Reconciler> = [(&na, "a", "10.77.0.1"), (&nc, "c", "10.78.0.3")]
        .into_iter()
        .map(|(ns, name, ip)| {
            in_ns(ns, || {
                let cfg = config(name, ip);
                masq::enable_forwarding(&cfg.cluster_cidrs).expect("forwarding");
                masq::apply(&cfg.cluster_cidrs).expect("masquerade");
                let r = Reconciler::new(&cfg).expect("new");
                assert_eq!(r.overlay(), Some(vxlan::DEVICE));
                let report = r.sync_peers(&peers).expect("sync");
                assert!(report.errors.is_empty(), "{:?}", report.errors);
                assert!(report.plan.unroutable.is_empty(), "{:?}", report.plan);
                r
            })
        })
        .collect();
    let sync_a = |peers: &[Peer]| {
        in_ns(&na, || {
            let report = reconcilers[0].sync_peers(peers).expect("sync");
            assert!(report.errors.is_empty(), "{:?}", report.errors);
        })
    };

    // The route, neighbour and forwarding entry on a for c's range.
    assert_eq!(
        ours(&na),
        vec![("10.42.2.0/24".to_string(), "10.42.2.0".to_string())]
    );
    let neigh = sh(&["ip", "-n", &na, "neigh", "show", "dev", vxlan::DEVICE]);
    let mac_c = vxlan::vtep_mac("10.78.0.3".parse().expect("ip"));
    assert!(
        neigh.contains(&format!("10.42.2.0 lladdr {mac_c} PERMANENT")),
        "{neigh}"
    );
    let fdb = in_ns(&na, || sh(&["bridge", "fdb", "show", "dev", vxlan::DEVICE]));
    assert!(fdb.contains(&format!("{mac_c} dst 10.78.0.3")), "{fdb}");
    // The router has no route to any pod range: whatever gets through was tunnelled.
    let router_routes = sh(&["ip", "-n", &nr, "route", "show"]);
    assert!(!router_routes.contains("10.42."), "{router_routes}");

    // Pod to pod across the router, both ways, with the pods' own addresses.
    let (seen, client) = observe(&pc, "10.42.2.2:8080", &pa);
    assert_eq!(client, Ok(()));
    assert_eq!(seen, Some("10.42.0.2".parse().expect("ip")));
    let (seen, client) = observe(&pa, "10.42.0.2:8080", &pc);
    assert_eq!(client, Ok(()));
    assert_eq!(seen, Some("10.42.2.2".parse().expect("ip")));
    // The host's own connection to a remote pod leaves with the device's address, inside the
    // pod ranges, and its answer comes back through the tunnel.
    let (seen, client) = observe(&pc, "10.42.2.2:8081", &na);
    assert_eq!(client, Ok(()));
    assert_eq!(seen, Some("10.42.0.0".parse().expect("ip")));

    // A connection through the tunnel has its MSS clamped to the tunnel's MTU (1450 - 40)
    // from its SYN on, before any packet could teach either side the path's MTU (so first,
    // before the big transfer below leaves a learned MTU in the routing cache).
    let listener = in_ns(&pc, || TcpListener::bind("10.42.2.2:8091").expect("bind"));
    let _held = in_ns(&pa, || {
        TcpStream::connect_timeout(&"10.42.2.2:8091".parse().expect("addr"), CONNECT_TIMEOUT)
            .expect("connect")
    });
    let (_accepted, _) = listener.accept().expect("accept");
    let mss = established_mss(&pc, 8091).expect("mss in ss");
    assert!(
        mss <= LINK_MTU - vxlan::OVERHEAD_V4 - IPV4_TCP_HEADERS,
        "the server's MSS toward the tunnel is {mss}, not clamped"
    );

    // A megabyte crosses the tunnel.
    let listener = in_ns(&pc, || TcpListener::bind("10.42.2.2:8090").expect("bind"));
    const BYTES: usize = 1 << 20;
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let (mut c, _) = listener.accept().expect("accept");
            c.write_all(&vec![7u8; BYTES]).expect("send");
        });
        let received = in_ns(&pa, || {
            let mut c = TcpStream::connect_timeout(
                &"10.42.2.2:8090".parse().expect("addr"),
                CONNECT_TIMEOUT,
            )
            .expect("connect");
            c.set_read_timeout(Some(CONNECT_TIMEOUT * 3))
                .expect("timeout");
            let mut got = Vec::new();
            c.read_to_end(&mut got).expect("read");
            got.len()
        });
        server.join().expect("server");
        assert_eq!(received, BYTES);
    });
    // Someone deletes the device: the next sync creates it again and the path is back.
    sh(&["ip", "-n", &na, "link", "del", vxlan::DEVICE]);
    sync_a(&peers);
    let (seen, client) = observe(&pc, "10.42.2.2:8082", &pa);
    assert_eq!(client, Ok(()));
    assert_eq!(seen, Some("10.42.0.2".parse().expect("ip")));

    // c's Node is deleted: its route, neighbour and forwarding entries go.
    sync_a(&peers[..1]);
    assert!(ours(&na).is_empty());
    let neigh = sh(&["ip", "-n", &na, "neigh", "show", "dev", vxlan::DEVICE]);
    assert!(!neigh.contains("lladdr"), "{neigh}");
    let fdb = in_ns(&na, || sh(&["bridge", "fdb", "show", "dev", vxlan::DEVICE]));
    assert!(!fdb.contains("dst"), "{fdb}");
}
