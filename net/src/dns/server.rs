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
/// upstreams from `config.resolv_conf`, and serves on `config.listen` over UDP and TCP.
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
    let upstreams = forward::upstreams(&config.resolv_conf, &own);
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
