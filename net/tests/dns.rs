//! Cluster DNS against a real apiserver in process (`TestServer`): Services and
//! EndpointSlices written through the API resolve through real UDP and TCP queries, a name
//! outside the cluster is forwarded to an upstream of the test's own on loopback, and the
//! kube-dns Service and EndpointSlice are created and follow a node turning NotReady.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_server::proto::op::{Message, Query, ResponseCode};
use hickory_server::proto::rr::{Name, RData, RecordType};
use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeAddress, NodeCondition, NodeStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Client, PostParams};
use skerry_net::dns::forward::{exchange_tcp, exchange_udp};
use skerry_net::dns::service::{
    MANAGED_BY, MANAGED_BY_LABEL, NAMESPACE, SERVICE_NAME, SERVICE_NAME_LABEL, SLICE_NAME,
};
use skerry_net::dns::testing::Upstream;
use skerry_net::dns::{DnsConfig, run_server, run_service_controller};
use tokio_util::sync::CancellationToken;

/// How long a test waits for the informers and the controller: well over their reaction
/// (a watch event), with room for two busy cores.
const CONVERGE: Duration = Duration::from_secs(30);
/// One query's timeout.
const QUERY: Duration = Duration::from_secs(5);
/// Polling interval while waiting.
const POLL: Duration = Duration::from_millis(50);

fn admin(server: &TestServer) -> Client {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = 0.0;
    Client::new(config).unwrap()
}

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + CONVERGE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

fn question(n: &str, t: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(n).unwrap(), t));
    m
}

fn rdatas(m: &Message) -> Vec<String> {
    let mut v: Vec<String> = m.answers.iter().map(|r| r.data.to_string()).collect();
    v.sort();
    v
}

fn meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ns.to_string()),
        ..ObjectMeta::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_resolve_and_outside_names_are_forwarded() {
    let server = TestServer::start().await.unwrap();
    let client = admin(&server);
    let upstream = Upstream::start(&[("outside.example.", vec![Ipv4Addr::new(192, 0, 2, 7)])])
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let mut config = DnsConfig::new(vec!["127.0.0.1:0".parse().unwrap()], "node-a");
    config.upstreams = vec![upstream.addr];
    let bound = run_server(client.clone(), config, stop.clone())
        .await
        .unwrap();
    let dns: SocketAddr = bound[0];

    client
        .api::<Namespace>(None)
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("shop".to_string()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .unwrap();

    // A ClusterIP Service: its allocated address, over UDP and over TCP.
    let services = client.api::<Service>(Some("shop"));
    let web = services
        .create(
            &PostParams::default(),
            &Service {
                metadata: meta("shop", "web"),
                spec: Some(ServiceSpec {
                    ports: Some(vec![ServicePort {
                        name: Some("http".to_string()),
                        port: 80,
                        ..ServicePort::default()
                    }]),
                    ..ServiceSpec::default()
                }),
                ..Service::default()
            },
        )
        .await
        .unwrap();
    let ip = web.spec.unwrap().cluster_ip.unwrap();
    let q = question("web.shop.svc.cluster.local.", RecordType::A);
    let a = eventually("web to resolve", || async {
        let m = exchange_udp(dns, &q, QUERY).await.ok()?;
        (m.metadata.response_code == ResponseCode::NoError && !m.answers.is_empty()).then_some(m)
    })
    .await;
    assert_eq!(rdatas(&a), std::slice::from_ref(&ip));
    assert!(a.metadata.authoritative);
    let t = exchange_tcp(dns, &q, QUERY).await.unwrap();
    assert_eq!(rdatas(&t), std::slice::from_ref(&ip));
    let srv = exchange_udp(
        dns,
        &question("_http._tcp.web.shop.svc.cluster.local.", RecordType::SRV),
        QUERY,
    )
    .await
    .unwrap();
    assert_eq!(rdatas(&srv), ["0 100 80 web.shop.svc.cluster.local."]);
    let ptr_name = Name::from(ip.parse::<IpAddr>().unwrap()).to_ascii();
    let ptr = exchange_udp(dns, &question(&ptr_name, RecordType::PTR), QUERY)
        .await
        .unwrap();
    assert_eq!(rdatas(&ptr), ["web.shop.svc.cluster.local."]);

    // A headless Service: its pods' IPs, from the EndpointSlice (written here as the
    // EndpointSlice controller would).
    services
        .create(
            &PostParams::default(),
            &Service {
                metadata: meta("shop", "db"),
                spec: Some(ServiceSpec {
                    cluster_ip: Some("None".to_string()),
                    ports: Some(vec![ServicePort {
                        port: 5432,
                        ..ServicePort::default()
                    }]),
                    ..ServiceSpec::default()
                }),
                ..Service::default()
            },
        )
        .await
        .unwrap();
    let endpoint = |ip: &str, host: Option<&str>| Endpoint {
        addresses: vec![ip.to_string()],
        hostname: host.map(str::to_string),
        conditions: Some(EndpointConditions {
            ready: Some(true),
            ..EndpointConditions::default()
        }),
        ..Endpoint::default()
    };
    client
        .api::<EndpointSlice>(Some("shop"))
        .create(
            &PostParams::default(),
            &EndpointSlice {
                metadata: ObjectMeta {
                    labels: Some(BTreeMap::from([(
                        SERVICE_NAME_LABEL.to_string(),
                        "db".to_string(),
                    )])),
                    ..meta("shop", "db-1")
                },
                address_type: "IPv4".to_string(),
                endpoints: vec![
                    endpoint("10.244.1.5", Some("db-0")),
                    endpoint("10.244.2.6", Some("db-1")),
                ],
                ports: None,
            },
        )
        .await
        .unwrap();
    let q = question("db.shop.svc.cluster.local.", RecordType::A);
    let a = eventually("db to resolve to its pods", || async {
        let m = exchange_udp(dns, &q, QUERY).await.ok()?;
        (m.answers.len() == 2).then_some(m)
    })
    .await;
    assert_eq!(rdatas(&a), ["10.244.1.5", "10.244.2.6"]);
    let host = exchange_udp(
        dns,
        &question("db-1.db.shop.svc.cluster.local.", RecordType::A),
        QUERY,
    )
    .await
    .unwrap();
    assert_eq!(rdatas(&host), ["10.244.2.6"]);

    // An ExternalName Service: a CNAME.
    services
        .create(
            &PostParams::default(),
            &Service {
                metadata: meta("shop", "ext"),
                spec: Some(ServiceSpec {
                    type_: Some("ExternalName".to_string()),
                    external_name: Some("outside.example".to_string()),
                    ..ServiceSpec::default()
                }),
                ..Service::default()
            },
        )
        .await
        .unwrap();
    let q = question("ext.shop.svc.cluster.local.", RecordType::A);
    let a = eventually("ext to answer a CNAME", || async {
        let m = exchange_udp(dns, &q, QUERY).await.ok()?;
        (!m.answers.is_empty()).then_some(m)
    })
    .await;
    assert!(matches!(&a.answers[0].data, RData::CNAME(c) if c.0.to_ascii() == "outside.example."));

    // Names that do not exist, and a name outside the cluster (forwarded, then cached).
    let nx = exchange_udp(
        dns,
        &question("nope.shop.svc.cluster.local.", RecordType::A),
        QUERY,
    )
    .await
    .unwrap();
    assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
    for _ in 0..3 {
        let out = exchange_udp(dns, &question("outside.example.", RecordType::A), QUERY)
            .await
            .unwrap();
        assert_eq!(rdatas(&out), ["192.0.2.7"]);
        assert!(!out.metadata.authoritative);
    }
    assert_eq!(upstream.udp_queries(), 1, "the repeats came from the cache");
    // Cluster names never go upstream.
    assert_eq!(upstream.tcp_queries(), 0);
    stop.cancel();
}

fn node(name: &str, ip: &str, ready: bool) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".to_string(),
                address: ip.to_string(),
            }]),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_string(),
                status: if ready { "True" } else { "False" }.to_string(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

async fn set_node(client: &Client, name: &str, ip: &str, ready: bool) {
    let nodes = client.api::<Node>(None);
    let want = node(name, ip, ready);
    let mut current = match nodes.get_opt(name).await.unwrap() {
        Some(n) => n,
        None => nodes.create(&PostParams::default(), &want).await.unwrap(),
    };
    current.status = want.status;
    nodes
        .replace_status(name, &PostParams::default(), &current)
        .await
        .unwrap();
}

/// The slice's (nodeName, address) pairs.
fn endpoints_of(slice: &EndpointSlice) -> Vec<(String, String)> {
    slice
        .endpoints
        .iter()
        .map(|e| {
            (
                e.node_name.clone().unwrap_or_default(),
                e.addresses.first().cloned().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_dns_service_and_slice_follow_the_nodes() {
    let server = TestServer::start().await.unwrap();
    let client = admin(&server);
    set_node(&client, "box-a", "10.1.0.1", true).await;
    set_node(&client, "box-b", "10.1.0.2", true).await;
    let stop = CancellationToken::new();
    let config = DnsConfig::new(Vec::new(), "box-a");
    tokio::spawn(run_service_controller(client.clone(), config, stop.clone()));

    let services = client.api::<Service>(Some(NAMESPACE));
    let svc = eventually("the kube-dns Service", || async {
        services.get_opt(SERVICE_NAME).await.ok().flatten()
    })
    .await;
    let spec = svc.spec.clone().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.10"));
    assert_eq!(spec.selector, None, "selectorless");
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Local"));
    let ports: Vec<(String, i32, String)> = spec
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.port, p.protocol.unwrap()))
        .collect();
    assert_eq!(
        ports,
        [
            ("dns".to_string(), 53, "UDP".to_string()),
            ("dns-tcp".to_string(), 53, "TCP".to_string()),
            ("metrics".to_string(), 9153, "TCP".to_string()),
        ]
    );
    assert_eq!(
        svc.metadata
            .labels
            .unwrap()
            .get("k8s-app")
            .map(String::as_str),
        Some("kube-dns")
    );

    let slices = client.api::<EndpointSlice>(Some(NAMESPACE));
    let both = vec![
        ("box-a".to_string(), "10.1.0.1".to_string()),
        ("box-b".to_string(), "10.1.0.2".to_string()),
    ];
    let slice = eventually("the kube-dns slice with both nodes", || async {
        let s = slices.get_opt(SLICE_NAME).await.ok().flatten()?;
        (endpoints_of(&s) == both).then_some(s)
    })
    .await;
    let labels = slice.metadata.labels.clone().unwrap();
    assert_eq!(
        labels.get(SERVICE_NAME_LABEL).map(String::as_str),
        Some(SERVICE_NAME)
    );
    assert_eq!(
        labels.get(MANAGED_BY_LABEL).map(String::as_str),
        Some(MANAGED_BY)
    );
    assert_eq!(
        slice.metadata.owner_references.unwrap()[0].uid,
        svc.metadata.uid.unwrap()
    );

    // box-b turns NotReady: its address leaves the slice; back Ready, it returns.
    set_node(&client, "box-b", "10.1.0.2", false).await;
    eventually("box-b to leave the slice", || async {
        let s = slices.get_opt(SLICE_NAME).await.ok().flatten()?;
        (endpoints_of(&s) == both[..1]).then_some(())
    })
    .await;
    set_node(&client, "box-b", "10.1.0.2", true).await;
    eventually("box-b to come back", || async {
        let s = slices.get_opt(SLICE_NAME).await.ok().flatten()?;
        (endpoints_of(&s) == both).then_some(())
    })
    .await;

    // A deleted slice is recreated (on the next resync or node event).
    slices
        .delete(SLICE_NAME, &skerry_client::DeleteParams::default())
        .await
        .unwrap();
    set_node(&client, "box-c", "10.1.0.3", true).await;
    eventually("the slice to be recreated with box-c", || async {
        let s = slices.get_opt(SLICE_NAME).await.ok().flatten()?;
        (endpoints_of(&s).len() == 3).then_some(())
    })
    .await;
    stop.cancel();
}
