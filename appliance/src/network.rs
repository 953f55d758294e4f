//! Wiring of the node's network (`skerry-net`) into the node agent: on every node, beside the
//! kubelet and as kube-proxy's user (`system:kube-proxy`, bound to `system:node-proxier`: its
//! own certificate, so the node's identity keeps reading only its own Node), the routes to the other nodes' pod ranges and the egress
//! masquerade, the nftables service proxy, the userspace proxy of localhost NodePorts, and
//! cluster DNS on the node's address; their metrics where kube-proxy's and CoreDNS's are
//! scraped (`127.0.0.1:10249`, `<node IP>:9153`).
//!
//! `--disable-network` leaves all of it off, for a box whose network another program runs (and
//! for tests that start several servers in one network namespace, which would otherwise share
//! one table and one port 53). A piece that cannot start says so in one line and the others
//! run: a node without cluster DNS still routes Services.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use skerry_client::Client;
use skerry_net::dns::{self, DnsConfig};
use skerry_net::proxy::{self, ProxyConfig};
use skerry_net::routes::{self, RoutesConfig, plan::Cidr};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::node::NodeArgs;

/// kube-proxy's `--metrics-bind-address` default: its metrics on the loopback only.
pub const PROXY_METRICS_DEFAULT: &str = "127.0.0.1:10249";
/// The index of the cluster DNS address in the Service range: kubeadm's and k3s's `.10`
/// (`10.96.0.10` in `10.96.0.0/12`), inside the allocator's static band, so no dynamically
/// allocated ClusterIP takes it first.
pub const CLUSTER_DNS_INDEX: u32 = 10;
/// The content type of the metrics pages (what prometheus-client's text encoder writes).
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The cluster DNS address of a Service range (`a.b.c.d/n`): its [`CLUSTER_DNS_INDEX`]th address.
pub fn cluster_dns_of(service_range: &str) -> Option<IpAddr> {
    let (addr, prefix) = service_range.split_once('/')?;
    let addr: std::net::Ipv4Addr = addr.parse().ok()?;
    let prefix: u32 = prefix.parse().ok()?;
    if prefix > 28 {
        return None;
    }
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    Some(IpAddr::V4(
        (u32::from(addr) & mask)
            .checked_add(CLUSTER_DNS_INDEX)?
            .into(),
    ))
}

/// What the node's network needs from the node agent.
pub struct NetworkContext<'a> {
    pub args: &'a NodeArgs,
    pub client: Client,
    pub node_name: String,
    pub node_ip: IpAddr,
    pub resolv_conf: PathBuf,
}

/// Starts the node's network in the background until `stop`.
pub async fn start(cx: NetworkContext<'_>, stop: CancellationToken) {
    let args = cx.args;
    if args.disable_network {
        info!("the node's network is off (--disable-network)");
        return;
    }
    let cidrs: Vec<String> = args
        .cluster_cidr
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect();
    if skerry_node::containerd::find_on_path("nft").is_none() {
        eprintln!(
            "skerry: no service proxy and no pod routes: nft is missing (apt-get install nftables, or scripts/node-packages)"
        );
    } else {
        // Routes between the nodes' pod ranges and the egress masquerade.
        let parsed: Result<Vec<Cidr>, String> = cidrs.iter().map(|c| Cidr::parse(c)).collect();
        match parsed {
            Ok(cluster_cidrs) => {
                let config = RoutesConfig {
                    node_name: cx.node_name.clone(),
                    cluster_cidrs,
                    node_ip: cx.node_ip,
                    link: None,
                };
                let (client, stop) = (cx.client.clone(), stop.clone());
                tokio::spawn(async move {
                    if let Err(e) = routes::run(client, config, stop).await {
                        eprintln!("skerry: no routes to the other nodes' pods: {e}");
                    }
                });
            }
            Err(e) => eprintln!("skerry: no routes to the other nodes' pods: --cluster-cidr: {e}"),
        }
        // The service proxy.
        let config = ProxyConfig {
            node_name: cx.node_name.clone(),
            node_ips: vec![cx.node_ip],
            cluster_cidrs: cidrs.clone(),
            zone: None,
            nft: vec!["nft".to_string()],
            min_sync_period: proxy::DEFAULT_MIN_SYNC_PERIOD,
        };
        let (client, task_stop) = (cx.client.clone(), stop.clone());
        let metrics_addr = args.proxy_metrics_bind_address;
        tokio::spawn(async move {
            let metrics_stop = task_stop.clone();
            let started = move |proxy: Arc<proxy::Proxy>| {
                if let Some(addr) = metrics_addr {
                    let encode = move || proxy.metrics().encode();
                    tokio::spawn(serve_metrics(addr, Arc::new(encode), metrics_stop));
                }
            };
            if let Err(e) = proxy::run_with(client, config, task_stop, started).await {
                eprintln!("skerry: the service proxy stopped: {e:#}");
            }
        });
    }
    // NodePorts on the loopback, which nftables cannot DNAT to.
    tokio::spawn(skerry_net::localhost::run(cx.client.clone(), stop.clone()));
    // Cluster DNS on the node's address.
    let mut config = DnsConfig::new(
        vec![SocketAddr::new(cx.node_ip, dns::DNS_PORT)],
        &cx.node_name,
    );
    config.cluster_domain = args.cluster_domain.clone();
    config.resolv_conf = cx.resolv_conf.clone();
    if let Some(ip) = args.cluster_dns.first() {
        config.cluster_dns_ip = *ip;
    }
    match dns::run_server(cx.client.clone(), config, stop.clone()).await {
        Ok(bound) => {
            info!(?bound, "cluster DNS serving");
            let metrics = SocketAddr::new(cx.node_ip, dns::service::METRICS_PORT);
            let encode = || dns::metrics::metrics().encode();
            tokio::spawn(serve_metrics(metrics, Arc::new(encode), stop));
        }
        Err(e) => eprintln!("skerry: no cluster DNS on this node: {e:#}"),
    }
}

/// Serves `/metrics` (what `encode` writes) on `addr` until `stop`; a port that cannot be
/// bound is one line.
async fn serve_metrics(
    addr: SocketAddr,
    encode: Arc<dyn Fn() -> String + Send + Sync>,
    stop: CancellationToken,
) {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            warn!(%addr, error = %e, "metrics: cannot listen");
            return;
        }
    };
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(error = %e, "metrics: accept");
                    continue;
                }
            },
        };
        let encode = encode.clone();
        let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            let encode = encode.clone();
            async move { Ok::<_, Infallible>(metrics_response(request.uri().path(), &*encode)) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn metrics_response(
    path: &str,
    encode: &(dyn Fn() -> String + Send + Sync),
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (StatusCode::OK, METRICS_CONTENT_TYPE, encode()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "404 page not found\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = http::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_dns_address_is_the_tenth_of_the_service_range() {
        assert_eq!(
            cluster_dns_of("10.96.0.0/12"),
            Some("10.96.0.10".parse().unwrap())
        );
        assert_eq!(
            cluster_dns_of("10.43.0.0/16"),
            Some("10.43.0.10".parse().unwrap())
        );
        assert_eq!(
            cluster_dns_of("10.43.7.9/16"),
            Some("10.43.0.10".parse().unwrap())
        );
        assert_eq!(cluster_dns_of("10.0.0.0/30"), None, "too small for a .10");
        assert_eq!(cluster_dns_of("nonsense"), None);
    }

    #[test]
    fn only_metrics_is_served() {
        let encode = || "x 1\n".to_string();
        let ok = metrics_response("/metrics", &encode);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            metrics_response("/", &encode).status(),
            StatusCode::NOT_FOUND
        );
    }
}
