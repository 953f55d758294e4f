//! The localhost NodePort proxy with real sockets on loopback, driven by a real apiserver's
//! Services and EndpointSlices through informers: a TCP NodePort answered on `127.0.0.1`
//! by the test's endpoint servers (both chosen over many connections, a half-close passed
//! through), a UDP NodePort relayed, a port another program holds skipped without keeping
//! the others from opening, and a deleted Service's port closed.
//!
//! Endpoints listen on `127.0.0.2` and `127.0.0.3` (the whole of 127/8 is loopback), so two
//! of them share one target port as pods of a Deployment do.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};
use skerry_apiserver::testing::TestServer;
use skerry_client::api::{DeleteParams, PostParams};
use skerry_net::localhost;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

/// Generous next to one sync on a loaded two-core machine.
const CONVERGE: Duration = Duration::from_secs(30);

/// Connections made to see both endpoints chosen: the chance that 40 random picks of two
/// all land on one is 2^-39.
const CONNECTIONS: usize = 40;

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A port of the default NodePort range that is free on 127.0.0.1 (TCP and UDP) now.
fn free_node_port(taken: &mut BTreeSet<u16>) -> u16 {
    for port in (30000 + rand::random_range(0..2000u16))..32767 {
        if taken.contains(&port) {
            continue;
        }
        let tcp = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port));
        let udp = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, port));
        if tcp.is_ok() && udp.is_ok() {
            taken.insert(port);
            return port;
        }
    }
    panic!("no free port in the NodePort range");
}

/// A TCP endpoint's listener.
async fn tcp_endpoint(ip: IpAddr, port: u16) -> TcpListener {
    TcpListener::bind((ip, port)).await.expect("endpoint bind")
}

/// Serves a TCP endpoint that reads its client to the end (so it sees the half-close),
/// then answers `<name>:<what it read>` and closes.
fn serve_tcp(listener: TcpListener, name: &'static str) {
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                if conn.read_to_end(&mut got).await.is_ok() {
                    let reply = format!("{name}:{}", String::from_utf8_lossy(&got));
                    let _ = conn.write_all(reply.as_bytes()).await;
                }
            });
        }
    });
}

/// One exchange through `port`: send, half-close, read the answer to the end.
async fn ask(port: u16, what: &str) -> std::io::Result<String> {
    let mut conn = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
    conn.write_all(what.as_bytes()).await?;
    conn.shutdown().await?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await?;
    Ok(answer)
}

fn service(name: &str, port: Value) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "NodePort", "ports": [port]}}))
    .expect("service")
}

fn slice(name: &str, service: &str, protocol: &str, port: u16, ips: &[&str]) -> EndpointSlice {
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default",
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "", "protocol": protocol, "port": port}],
        "endpoints": endpoints,
    }))
    .expect("slice")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ports_answer_on_localhost_and_follow_the_services() {
    let server = TestServer::start().await.expect("apiserver");
    let client = common::admin_client(&server);

    // Two TCP endpoints on one port, a UDP echo endpoint.
    let a = tcp_endpoint(loopback(2), 0).await;
    let target = a.local_addr().expect("addr").port();
    let b = tcp_endpoint(loopback(3), target).await;
    serve_tcp(a, "a");
    serve_tcp(b, "b");
    let echo = UdpSocket::bind((loopback(2), 0))
        .await
        .expect("udp endpoint");
    let udp_target = echo.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = echo.recv_from(&mut buf).await {
            let mut reply = b"echo:".to_vec();
            reply.extend_from_slice(&buf[..n]);
            let _ = echo.send_to(&reply, from).await;
        }
    });

    let mut taken = BTreeSet::new();
    let web_port = free_node_port(&mut taken);
    let dns_port = free_node_port(&mut taken);
    let busy_port = free_node_port(&mut taken);
    // Another program holds the busy port.
    let other_program = TcpListener::bind((Ipv4Addr::LOCALHOST, busy_port))
        .await
        .expect("the other program's port");

    let services = client.api::<Service>(Some("default"));
    let slices = client.api::<EndpointSlice>(Some("default"));
    let post = PostParams::default();
    for svc in [
        service(
            "busy",
            json!({"port": 80, "protocol": "TCP", "nodePort": busy_port}),
        ),
        service(
            "web",
            json!({"port": 80, "protocol": "TCP", "nodePort": web_port}),
        ),
        service(
            "dns",
            json!({"port": 53, "protocol": "UDP", "nodePort": dns_port}),
        ),
    ] {
        services.create(&post, &svc).await.expect("service created");
    }
    for s in [
        slice("web-1", "web", "TCP", target, &["127.0.0.2", "127.0.0.3"]),
        slice("busy-1", "busy", "TCP", target, &["127.0.0.2"]),
        slice("dns-1", "dns", "UDP", udp_target, &["127.0.0.2"]),
    ] {
        slices.create(&post, &s).await.expect("slice created");
    }

    let stop = CancellationToken::new();
    let _stop_on_drop = stop.clone().drop_guard();
    tokio::spawn(localhost::run(client.clone(), stop.clone()));

    // TCP: answered through 127.0.0.1, the half-close reaching the endpoint.
    let first = common::eventually(CONVERGE, "web answers on localhost", || async {
        ask(web_port, "hello").await.ok().filter(|a| !a.is_empty())
    })
    .await;
    assert!(first == "a:hello" || first == "b:hello", "{first}");
    let mut seen = BTreeSet::new();
    for i in 0..CONNECTIONS {
        let answer = ask(web_port, &i.to_string()).await.expect("answered");
        let (who, echoed) = answer.split_once(':').expect("name:payload");
        assert_eq!(echoed, i.to_string());
        seen.insert(who.to_string());
    }
    assert_eq!(seen, BTreeSet::from(["a".to_string(), "b".to_string()]));

    // UDP: relayed both ways.
    let client_socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("udp client");
    let reply = common::eventually(CONVERGE, "dns answers on localhost", || async {
        client_socket
            .send_to(b"query", (Ipv4Addr::LOCALHOST, dns_port))
            .await
            .ok()?;
        let mut buf = [0u8; 1500];
        let (n, from) = tokio::time::timeout(
            Duration::from_millis(200),
            client_socket.recv_from(&mut buf),
        )
        .await
        .ok()?
        .ok()?;
        assert_eq!(from, SocketAddr::new(loopback(1), dns_port));
        Some(buf[..n].to_vec())
    })
    .await;
    assert_eq!(reply, b"echo:query");

    // The busy port is still the other program's: its connections reach it, not the proxy.
    let _conn = TcpStream::connect((Ipv4Addr::LOCALHOST, busy_port))
        .await
        .expect("connect");
    tokio::time::timeout(Duration::from_secs(5), other_program.accept())
        .await
        .expect("the other program accepts")
        .expect("accepted");

    // A deleted Service's port closes.
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("web deleted");
    common::eventually(CONVERGE, "web's port closed", || async {
        TcpStream::connect((Ipv4Addr::LOCALHOST, web_port))
            .await
            .is_err()
            .then_some(())
    })
    .await;
    // The UDP port is still served.
    client_socket
        .send_to(b"again", (Ipv4Addr::LOCALHOST, dns_port))
        .await
        .expect("sent");
    let mut buf = [0u8; 1500];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), client_socket.recv_from(&mut buf))
        .await
        .expect("an answer")
        .expect("received");
    assert_eq!(&buf[..n], b"echo:again");
}

#[test]
fn terminating_endpoints_only_without_ready_ones() {
    let backends = |ready: bool| -> localhost::Backends {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "s-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "s"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": ready}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": false, "terminating": true}},
            ],
        }))
        .expect("slice");
        let svc: Service = serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "default"},
            "spec": {"type": "NodePort", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]}}))
        .expect("service");
        let table = localhost::desired(&[svc.into()], &[slice.into()]);
        table
            .get(&(localhost::Protocol::Tcp, 30080))
            .cloned()
            .expect("the node port")
    };
    let with_ready = backends(true);
    for _ in 0..20 {
        assert_eq!(
            with_ready.choose(),
            Some("10.0.0.1:8080".parse().expect("addr"))
        );
    }
    let without = backends(false);
    assert!(without.ready.is_empty());
    assert_eq!(
        without.choose(),
        Some("10.0.0.2:8080".parse().expect("addr"))
    );
}
