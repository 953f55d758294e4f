//! The DNS server: hickory-server's UDP and TCP listeners and skerry's request handler.
//!
//! hickory-server reads each message, answers FORMERR to one it cannot decode (a label over
//! 63 bytes, a name over 255, a truncated packet), and hands the rest to [`Handler`]. The
//! handler answers NOTIMP to anything but a standard query, FORMERR to a query without exactly
//! one question, asks the [`Zone`] first and the [`Forwarder`] for what the zone does not own,
//! and records CoreDNS's metrics. Over UDP a response is cut to the client's EDNS payload size
//! (512 bytes without EDNS) with the TC bit set, so the client retries over TCP; that cut is
//! hickory-server's encoder's.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hickory_server::Server;
use hickory_server::net::runtime::Time;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::{DNSClass, Record};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use skerry_client::Client;
use skerry_client::informer::SharedInformer;
use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::DnsConfig;
use super::forward::{self, EDNS_PAYLOAD, Forwarder};
use super::metrics::{Metrics, metrics, rcode_label};
use super::zone::{self, Answer, Zone};

/// How long a TCP connection may sit idle between queries: CoreDNS's `idleTimeout`
/// (`core/dnsserver/server.go`, 10 s), after which the connection is closed so idle clients
/// cannot hold sockets open.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The smallest UDP payload a client can be held to: RFC 1035's 512 bytes, the limit
/// without EDNS (RFC 6891 treats smaller advertised sizes as 512).
pub const MIN_UDP_PAYLOAD: u16 = 512;

/// Responses queued per TCP connection (hickory-server's buffer): a pipelining client gets
/// this many answers ahead before the connection waits for it to read.
pub const TCP_RESPONSE_BUFFER: usize = 32;

/// How long the server waits for its first list of Services and EndpointSlices before it
/// answers anyway: CoreDNS's `kubernetes` plugin waits 5 s (`plugin/kubernetes/setup.go`) and
/// then serves what it has, since a server answering nothing is worse than one answering
/// NXDOMAIN for a moment.
pub const SYNC_WAIT: Duration = Duration::from_secs(5);

/// Answers one message: the zone's, the forwarder's, or an error.
#[derive(Clone)]
pub struct Handler {
    zone: Zone,
    forwarder: Forwarder,
    metrics: Arc<Metrics>,
    /// The zone label of the metrics (`cluster.local.`).
    zone_label: Arc<str>,
}

impl Handler {
    /// A handler over `zone` and `forwarder`, counting into `metrics`.
    pub fn new(zone: Zone, forwarder: Forwarder, metrics: Arc<Metrics>) -> Handler {
        let zone_label = zone.domain().to_ascii().into();
        Handler {
            zone,
            forwarder,
            metrics,
            zone_label,
        }
    }

    /// The forwarder (its cache).
    pub fn forwarder(&self) -> &Forwarder {
        &self.forwarder
    }
}

fn failure_info(metadata: Metadata) -> ResponseInfo {
    ResponseInfo::from(Header {
        metadata,
        counts: HeaderCounts::default(),
    })
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let started = Instant::now();
        let proto = match request.protocol() {
            Protocol::Tcp => "tcp",
            _ => "udp",
        };
        let family = if request.src().is_ipv4() { "1" } else { "2" };
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.recursion_available = true;
        // Our EDNS: the client's payload size, no more than ours.
        let edns = request.edns.as_ref().map(|client| {
            let mut e = Edns::new();
            e.set_max_payload(client.max_payload().clamp(MIN_UDP_PAYLOAD, EDNS_PAYLOAD));
            e
        });
        let mut builder = MessageResponseBuilder::from_message_request(request);
        if let Some(e) = &edns {
            builder.edns(e);
        }

        let (zone_label, qtype, answer) = if request.metadata.op_code != OpCode::Query {
            metadata.response_code = ResponseCode::NotImp;
            (".".to_string(), "other".to_string(), None)
        } else {
            match request.request_info() {
                Err(_) => {
                    metadata.response_code = ResponseCode::FormErr;
                    (".".to_string(), "other".to_string(), None)
                }
                Ok(info) => {
                    let name = info.query.original().name().clone();
                    let rtype = info.query.query_type();
                    let class = info.query.query_class();
                    let qtype = rtype.to_string();
                    let own = if class == DNSClass::IN {
                        self.zone.answer(&name, rtype)
                    } else {
                        None
                    };
                    match own {
                        Some(answer) => {
                            metadata.authoritative = true;
                            (self.zone_label.to_string(), qtype, Some(answer))
                        }
                        None => {
                            let answer = self.forwarder.resolve(&name, rtype, class).await;
                            (".".to_string(), qtype, Some(answer))
                        }
                    }
                }
            }
        };
        self.metrics.request(&zone_label, proto, family, &qtype);

        let empty: Vec<Record> = Vec::new();
        let answer = answer.unwrap_or(Answer {
            rcode: metadata.response_code,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
        });
        metadata.response_code = answer.rcode;
        let response = builder.build(
            metadata,
            answer.answers.iter(),
            answer.authorities.iter(),
            empty.iter(),
            answer.additionals.iter(),
        );
        let info = match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(e) => {
                warn!(error = %e, "cluster DNS: sending a response failed");
                let mut failed = metadata;
                failed.response_code = ResponseCode::ServFail;
                failure_info(failed)
            }
        };
        self.metrics.response(
            &zone_label,
            &rcode_label(info.response_code),
            &qtype,
            started.elapsed(),
        );
        info
    }
}

/// Binds UDP and TCP on each of `listen` (TCP on the port UDP got when asked for port 0) and
/// serves `handler` until `stop`. Returns the bound addresses.
pub async fn serve(
    handler: Handler,
    listen: &[SocketAddr],
    stop: CancellationToken,
) -> anyhow::Result<Vec<SocketAddr>> {
    let mut server = Server::new(handler);
    let mut bound = Vec::new();
    for addr in listen {
        let udp = UdpSocket::bind(addr)
            .await
            .with_context(|| format!("bind UDP {addr}"))?;
        let local = udp.local_addr().context("UDP local address")?;
        let tcp = TcpListener::bind(local)
            .await
            .with_context(|| format!("bind TCP {local}"))?;
        server.register_socket(udp);
        server.register_listener(tcp, TCP_IDLE_TIMEOUT, TCP_RESPONSE_BUFFER);
        bound.push(local);
    }
    tokio::spawn(async move {
        stop.cancelled().await;
        if let Err(e) = server.shutdown_gracefully().await {
            warn!(error = %e, "cluster DNS: the server stopped with an error");
        }
    });
    Ok(bound)
}

/// The Service and EndpointSlice informers the zone reads, with its indexes, not yet running.
pub fn informers(
    client: &Client,
) -> anyhow::Result<(SharedInformer<Service>, SharedInformer<EndpointSlice>)> {
    let services = SharedInformer::new(client.api::<Service>(None), None);
    for (name, f) in zone::service_indexes() {
        services.add_index(name, f).map_err(anyhow::Error::msg)?;
    }
    let slices = SharedInformer::new(client.api::<EndpointSlice>(None), None);
    for (name, f) in zone::slice_indexes() {
        slices.add_index(name, f).map_err(anyhow::Error::msg)?;
    }
    Ok((services, slices))
}

/// Cluster DNS on this node until `stop`: watches Services and EndpointSlices, reads the
/// upstreams from `config.resolv_conf` (or takes `config.upstreams`), and serves on `config.listen` over UDP and TCP.
/// Returns once the listeners are bound (an error if one cannot be); serving goes on in the
/// background until `stop`. Counts into the process's [`metrics`].
pub async fn run_server(
    client: Client,
    config: DnsConfig,
    stop: CancellationToken,
) -> anyhow::Result<Vec<SocketAddr>> {
    let (services, slices) = informers(&client)?;
    services.run(stop.clone());
    slices.run(stop.clone());
    let zone = Zone::new(
        &config.cluster_domain,
        Some(config.cluster_dns_ip),
        services.store(),
        slices.store(),
    )
    .map_err(anyhow::Error::msg)?;
    let own: Vec<IpAddr> = config
        .listen
        .iter()
        .map(SocketAddr::ip)
        .chain([config.cluster_dns_ip])
        .collect();
    let upstreams = if config.upstreams.is_empty() {
        forward::upstreams(&config.resolv_conf, &own)
    } else {
        config.upstreams.clone()
    };
    info!(?upstreams, domain = %config.cluster_domain, "cluster DNS: upstream resolvers");
    let metrics = metrics();
    let forwarder = Forwarder::new(upstreams, config.cache_capacity, metrics.clone());
    let synced = tokio::time::timeout(SYNC_WAIT, async {
        services.wait_for_sync(&stop).await && slices.wait_for_sync(&stop).await
    })
    .await
    .unwrap_or(false);
    if !synced {
        warn!("cluster DNS: Services and EndpointSlices not listed yet; serving what is known");
    }
    let bound = serve(Handler::new(zone, forwarder, metrics), &config.listen, stop).await?;
    info!(?bound, "cluster DNS: serving");
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::Ipv4Addr;

    use hickory_server::proto::op::{Message, Query};
    use hickory_server::proto::rr::{Name, RecordType};
    use k8s_openapi::api::core::v1::ServiceSpec;
    use k8s_openapi::api::discovery::v1::Endpoint;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use skerry_client::cache::Indexer;

    use super::super::forward::{exchange_tcp, exchange_udp};
    use super::super::testing::Upstream;
    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    /// A server on loopback whose zone has the headless Service `shop/many` with 100 ready
    /// endpoints, forwarding to `upstream`.
    async fn server(
        upstream: SocketAddr,
        metrics: Arc<Metrics>,
    ) -> (SocketAddr, CancellationToken) {
        let services: Indexer<Service> = Indexer::new();
        for (n, f) in zone::service_indexes() {
            services.add_index(n, f).expect("index");
        }
        let slices: Indexer<EndpointSlice> = Indexer::new();
        for (n, f) in zone::slice_indexes() {
            slices.add_index(n, f).expect("index");
        }
        services.upsert(
            "shop/many",
            Arc::new(Service {
                metadata: ObjectMeta {
                    name: Some("many".to_string()),
                    namespace: Some("shop".to_string()),
                    ..ObjectMeta::default()
                },
                spec: Some(ServiceSpec {
                    cluster_ip: Some("None".to_string()),
                    ..ServiceSpec::default()
                }),
                ..Service::default()
            }),
        );
        slices.upsert(
            "shop/many-1",
            Arc::new(EndpointSlice {
                metadata: ObjectMeta {
                    name: Some("many-1".to_string()),
                    namespace: Some("shop".to_string()),
                    labels: Some(BTreeMap::from([(
                        zone::SERVICE_NAME_LABEL.to_string(),
                        "many".to_string(),
                    )])),
                    ..ObjectMeta::default()
                },
                address_type: "IPv4".to_string(),
                endpoints: (1..=100)
                    .map(|i| Endpoint {
                        addresses: vec![format!("10.244.0.{i}")],
                        ..Endpoint::default()
                    })
                    .collect(),
                ports: None,
            }),
        );
        let zone = Zone::new("cluster.local", None, services, slices).expect("zone");
        let forwarder = Forwarder::new(vec![upstream], 64, metrics.clone());
        let stop = CancellationToken::new();
        let bound = serve(
            Handler::new(zone, forwarder, metrics),
            &["127.0.0.1:0".parse().expect("addr")],
            stop.clone(),
        )
        .await
        .expect("serve");
        (bound[0], stop)
    }

    fn question(n: &str, t: RecordType) -> Message {
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(n).expect("name"), t));
        m
    }

    #[tokio::test]
    async fn answers_over_udp_and_tcp_with_truncation() {
        let up = Upstream::start(&[("example.org.", vec![Ipv4Addr::new(192, 0, 2, 1)])])
            .await
            .expect("upstream");
        let metrics = Arc::new(Metrics::new());
        let (addr, stop) = server(up.addr, metrics.clone()).await;

        // 100 A records do not fit 512 bytes: over UDP, TC and a cut answer.
        let q = question("many.shop.svc.cluster.local.", RecordType::A);
        let udp = exchange_udp(addr, &q, WAIT).await.expect("udp answer");
        assert!(udp.metadata.truncation, "TC over UDP");
        assert!(udp.metadata.authoritative);
        assert!(udp.answers.len() < 100);
        let tcp = exchange_tcp(addr, &q, WAIT).await.expect("tcp answer");
        assert!(!tcp.metadata.truncation);
        assert_eq!(tcp.answers.len(), 100);

        // Outside the zone: forwarded, not authoritative.
        let fwd = exchange_udp(addr, &question("example.org.", RecordType::A), WAIT)
            .await
            .expect("forwarded");
        assert_eq!(fwd.answers.len(), 1);
        assert!(!fwd.metadata.authoritative);
        assert!(fwd.metadata.recursion_available);

        let nx = exchange_udp(
            addr,
            &question("nope.shop.svc.cluster.local.", RecordType::A),
            WAIT,
        )
        .await
        .expect("nxdomain");
        assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);

        let text = metrics.encode();
        for needle in [
            "coredns_dns_requests_total{server=\"dns://:53\",zone=\"cluster.local.\",proto=\"udp\",family=\"1\",type=\"A\"} 2",
            "coredns_dns_requests_total{server=\"dns://:53\",zone=\"cluster.local.\",proto=\"tcp\",family=\"1\",type=\"A\"} 1",
            "coredns_dns_responses_total{server=\"dns://:53\",zone=\"cluster.local.\",rcode=\"NXDOMAIN\"} 1",
            "coredns_dns_responses_total{server=\"dns://:53\",zone=\".\",rcode=\"NOERROR\"} 1",
            "coredns_cache_misses_total{server=\"dns://:53\"} 1",
            "coredns_dns_request_duration_seconds_bucket",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
        stop.cancel();
    }

    #[tokio::test]
    async fn malformed_queries_get_formerr_and_the_server_keeps_serving() {
        let up = Upstream::start(&[]).await.expect("upstream");
        let (addr, stop) = server(up.addr, Arc::new(Metrics::new())).await;
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        socket.connect(addr).await.expect("connect");
        let mut buf = vec![0u8; 4096];

        // A header claiming one question, then a 64-byte label (over the 63 limit).
        let mut bad = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 64];
        bad.extend(std::iter::repeat_n(b'a', 64));
        bad.extend([0, 0, 1, 0, 1]);
        socket.send(&bad).await.expect("send");
        let n = tokio::time::timeout(WAIT, socket.recv(&mut buf))
            .await
            .expect("an answer")
            .expect("recv");
        let m = Message::from_vec(&buf[..n]).expect("decodable");
        assert_eq!(m.metadata.id, 0x1234);
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);

        // Two questions in one message: FORMERR from the handler.
        let mut two = question("a.shop.svc.cluster.local.", RecordType::A);
        two.add_query(Query::query(
            Name::from_ascii("b.shop.svc.cluster.local.").expect("name"),
            RecordType::A,
        ));
        let m = exchange_udp(addr, &two, WAIT).await.expect("answer");
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);

        // Garbage too short for a header gets nothing; the server still answers after it.
        socket.send(&[1, 2, 3]).await.expect("send");
        let ok = exchange_udp(
            addr,
            &question("many.shop.svc.cluster.local.", RecordType::AAAA),
            WAIT,
        )
        .await
        .expect("still serving");
        assert_eq!(ok.metadata.response_code, ResponseCode::NoError);
        assert!(ok.answers.is_empty(), "NODATA: no IPv6 endpoint");
        stop.cancel();
    }
}
