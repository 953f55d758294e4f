//! The localhost NodePort proxy (`docs/tricks.md` #33): NodePorts answered on `127.0.0.1`
//! (and `[::1]` when the host has it) by a small userspace proxy.
//!
//! kube-proxy's iptables mode reached NodePorts on localhost by DNAT with
//! `route_localnet=1`; nftables has no equivalent, and kube-proxy's nftables mode gives
//! localhost NodePorts up (KEP-3866). On an appliance, `curl localhost:<nodePort>` on the box
//! itself is the first thing anyone tries, so skerry listens there in userspace instead: one
//! listener per NodePort/LoadBalancer service port (TCP and UDP), opened and closed as
//! Services change, each new connection sent to a random ready endpoint of the Service
//! (terminating endpoints only when no ready one is left, kube-proxy's rule), the two
//! directions copied independently so a half-close on one side reaches the other. UDP is
//! relayed per client address through a socket of its own towards one endpoint, dropped
//! after an idle timeout. A port another program already holds is logged once and skipped;
//! the others still open.
//!
//! The model is small on purpose: Services and EndpointSlices from informers, turned into
//! `(protocol, nodePort) -> endpoints` by [`desired`]; the proxy ([`LocalhostProxy`]) only
//! ever sees that table.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use parking_lot::{Mutex, RwLock};
use rand::seq::IndexedRandom;
use skerry_client::Client;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use tokio::net::{TcpSocket, TcpStream, UdpSocket};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How long a UDP client's relay lives without a datagram either way: kube-proxy's
/// userspace mode default (`--udp-timeout`, `UDPIdleTimeout` 250 ms,
/// `pkg/proxy/apis/config/v1alpha1/defaults.go` before its removal).
pub const UDP_IDLE_TIMEOUT: Duration = Duration::from_millis(250);

/// The connect timeouts of the attempts at an endpoint, each to a fresh random pick: the
/// userspace proxier's `EndpointDialTimeouts` (`pkg/proxy/userspace/proxysocket.go`).
const DIAL_TIMEOUTS: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// The accept backlog of a listener: the kernel's default `somaxconn` (4096 since Linux
/// 5.4); more waiting connections than that on a loopback NodePort means something is wrong.
const LISTEN_BACKLOG: u32 = 4096;

/// The largest UDP datagram (65,535 bytes less the 8-byte UDP header and 20-byte IPv4 header).
const UDP_DATAGRAM_MAX: usize = 65_507;

/// The label an EndpointSlice names its Service with (`discovery.k8s.io/v1`
/// `LabelServiceName`).
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A NodePort's transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    fn parse(text: &str) -> Option<Protocol> {
        match text {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            // SCTP cannot be proxied in userspace without an SCTP stack; no NodePort here.
            _ => None,
        }
    }
}

/// One listener: a protocol and a node port.
pub type PortKey = (Protocol, u16);

/// Where a NodePort's connections go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backends {
    /// Ready endpoints.
    pub ready: Vec<SocketAddr>,
    /// Serving but terminating endpoints: used only when no ready one is left.
    pub terminating: Vec<SocketAddr>,
}

impl Backends {
    /// A random ready endpoint, else a random terminating one (kube-proxy's
    /// `CategorizeEndpoints` fallback).
    pub fn choose(&self) -> Option<SocketAddr> {
        let mut rng = rand::rng();
        self.ready
            .choose(&mut rng)
            .or_else(|| self.terminating.choose(&mut rng))
            .copied()
    }
}

/// The NodePorts every Service asks for and their endpoints, from the informers' objects.
pub fn desired(
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
) -> BTreeMap<PortKey, Backends> {
    let mut by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for slice in slices {
        let namespace = slice.metadata.namespace.as_deref().unwrap_or("");
        if let Some(service) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        {
            by_service
                .entry((namespace, service.as_str()))
                .or_default()
                .push(slice);
        }
    }
    let mut out = BTreeMap::new();
    for service in services {
        let Some(spec) = &service.spec else { continue };
        if !matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer")) {
            continue;
        }
        let namespace = service.metadata.namespace.as_deref().unwrap_or("");
        let name = service.metadata.name.as_deref().unwrap_or("");
        let slices = by_service
            .get(&(namespace, name))
            .map(Vec::as_slice)
            .unwrap_or_default();
        for port in spec.ports.iter().flatten() {
            let Some(node_port) = port.node_port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            let protocol_name = port.protocol.as_deref().unwrap_or("TCP");
            let Some(protocol) = Protocol::parse(protocol_name) else {
                continue;
            };
            let port_name = port.name.as_deref().unwrap_or("");
            out.insert(
                (protocol, node_port),
                endpoints_of(slices, port_name, protocol_name),
            );
        }
    }
    out
}

/// The endpoints of the service port named `port_name` in `slices`.
fn endpoints_of(slices: &[&EndpointSlice], port_name: &str, protocol: &str) -> Backends {
    let mut backends = Backends::default();
    for slice in slices {
        let Some(target) = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == port_name
                && p.protocol.as_deref().unwrap_or("TCP") == protocol
        }) else {
            continue;
        };
        let Some(number) = target.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for endpoint in &slice.endpoints {
            // The API's rules for absent conditions: ready and serving unknown mean yes,
            // terminating unknown means no.
            let conditions = endpoint.conditions.as_ref();
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            // kube-proxy uses an endpoint's first address.
            let Some(ip) = endpoint
                .addresses
                .first()
                .and_then(|a| a.parse::<IpAddr>().ok())
            else {
                continue;
            };
            let address = SocketAddr::new(ip, number);
            if ready && !terminating {
                backends.ready.push(address);
            } else if serving && terminating {
                backends.terminating.push(address);
            }
        }
    }
    backends.ready.sort();
    backends.ready.dedup();
    backends.terminating.sort();
    backends.terminating.dedup();
    backends
}

/// The table listeners read their endpoints from, swapped on every sync.
type Table = Arc<RwLock<BTreeMap<PortKey, Backends>>>;

/// The listeners, opened and closed by [`LocalhostProxy::apply`].
pub struct LocalhostProxy {
    table: Table,
    /// Open ports: cancelling a token closes that port's sockets.
    listening: HashMap<PortKey, CancellationToken>,
    /// Ports found held by another program, logged once.
    busy: HashSet<PortKey>,
    /// Whether `[::1]` is there to listen on too.
    ipv6: bool,
    stop: CancellationToken,
}

impl LocalhostProxy {
    /// A proxy with nothing open; everything it opens closes with `stop`.
    pub fn new(stop: CancellationToken) -> LocalhostProxy {
        // The host has IPv6 loopback if an ephemeral socket binds there.
        let ipv6 = std::net::UdpSocket::bind((Ipv6Addr::LOCALHOST, 0)).is_ok();
        LocalhostProxy {
            table: Arc::default(),
            listening: HashMap::new(),
            busy: HashSet::new(),
            ipv6,
            stop,
        }
    }

    /// The ports open now.
    pub fn listening(&self) -> Vec<PortKey> {
        let mut ports: Vec<PortKey> = self.listening.keys().copied().collect();
        ports.sort();
        ports
    }

    /// Makes the open ports and their endpoints those of `desired`: new ports opened, gone
    /// ones closed (their established connections too), endpoints swapped for new
    /// connections of the ports that stay.
    pub fn apply(&mut self, desired: BTreeMap<PortKey, Backends>) {
        self.listening.retain(|key, stop| {
            let keep = desired.contains_key(key);
            if !keep {
                stop.cancel();
                tracing::info!(protocol = ?key.0, port = key.1, "localhost NodePort closed");
            }
            keep
        });
        self.busy.retain(|key| desired.contains_key(key));
        let wanted: Vec<PortKey> = desired.keys().copied().collect();
        *self.table.write() = desired;
        for key in wanted {
            if self.listening.contains_key(&key) {
                continue;
            }
            match self.open(key) {
                Ok(stop) => {
                    self.busy.remove(&key);
                    self.listening.insert(key, stop);
                    tracing::info!(protocol = ?key.0, port = key.1, "localhost NodePort open");
                }
                Err(e) => {
                    if self.busy.insert(key) {
                        tracing::warn!(protocol = ?key.0, port = key.1, error = %e,
                            "localhost NodePort skipped: the port cannot be opened");
                    }
                }
            }
        }
    }

    /// Opens `key` on `127.0.0.1`, and on `[::1]` when the host has it (a failure there
    /// only logs: the IPv4 listener is what counts).
    fn open(&self, key: PortKey) -> io::Result<CancellationToken> {
        let stop = self.stop.child_token();
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), key.1);
        self.spawn_listener(key, v4, &stop)?;
        if self.ipv6 {
            let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), key.1);
            if let Err(e) = self.spawn_listener(key, v6, &stop) {
                tracing::debug!(port = key.1, error = %e, "no [::1] listener");
            }
        }
        Ok(stop)
    }

    fn spawn_listener(
        &self,
        key: PortKey,
        address: SocketAddr,
        stop: &CancellationToken,
    ) -> io::Result<()> {
        let table = self.table.clone();
        let stop = stop.clone();
        match key.0 {
            Protocol::Tcp => {
                let socket = match address {
                    SocketAddr::V4(_) => TcpSocket::new_v4()?,
                    SocketAddr::V6(_) => TcpSocket::new_v6()?,
                };
                // Re-opening a port whose last connections sit in TIME_WAIT; a port another
                // socket listens on still fails with EADDRINUSE.
                socket.set_reuseaddr(true)?;
                socket.bind(address)?;
                let listener = socket.listen(LISTEN_BACKLOG)?;
                tokio::spawn(accept_loop(listener, key, table, stop));
            }
            Protocol::Udp => {
                let socket = std::net::UdpSocket::bind(address)?;
                socket.set_nonblocking(true)?;
                let socket = UdpSocket::from_std(socket)?;
                tokio::spawn(udp_loop(Arc::new(socket), key, table, stop));
            }
        }
        Ok(())
    }
}

impl Drop for LocalhostProxy {
    fn drop(&mut self) {
        for stop in self.listening.values() {
            stop.cancel();
        }
    }
}

/// Accepts connections on one port until `stop`, each proxied on a task of its own.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    key: PortKey,
    table: Table,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((client, _)) => {
                let table = table.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = proxy_tcp(client, key, &table) => {}
                    }
                });
            }
            Err(e) => {
                // EMFILE and friends: let the process breathe before the next accept.
                tracing::warn!(port = key.1, error = %e, "localhost NodePort accept failed");
                tokio::time::sleep(DIAL_TIMEOUTS[0]).await;
            }
        }
    }
}

/// One TCP connection: to a random endpoint (a new pick per failed attempt), then both
/// directions copied until each has ended (a half-close is passed on, not treated as the
/// end).
async fn proxy_tcp(mut client: TcpStream, key: PortKey, table: &Table) {
    for timeout in DIAL_TIMEOUTS {
        let Some(endpoint) = table.read().get(&key).and_then(Backends::choose) else {
            // No endpoint: the connection is closed at once, as kube-proxy rejects it.
            return;
        };
        match tokio::time::timeout(timeout, TcpStream::connect(endpoint)).await {
            Ok(Ok(mut upstream)) => {
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                    tracing::debug!(port = key.1, %endpoint, error = %e, "connection ended");
                }
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(port = key.1, %endpoint, error = %e, "endpoint refused");
            }
            Err(_) => tracing::debug!(port = key.1, %endpoint, "endpoint dial timed out"),
        }
    }
}

/// Relays one UDP port's datagrams until `stop`: one session per client address, each with
/// a socket connected to one endpoint.
async fn udp_loop(socket: Arc<UdpSocket>, key: PortKey, table: Table, stop: CancellationToken) {
    let sessions: Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>> = Arc::default();
    let mut buffer = vec![0u8; UDP_DATAGRAM_MAX];
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => return,
            received = socket.recv_from(&mut buffer) => received,
        };
        let (len, client) = match received {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(port = key.1, error = %e, "localhost NodePort receive failed");
                continue;
            }
        };
        let existing = sessions.lock().get(&client).cloned();
        let upstream = match existing {
            Some(upstream) => upstream,
            None => {
                let Some(endpoint) = table.read().get(&key).and_then(Backends::choose) else {
                    continue;
                };
                let upstream = match udp_session(endpoint).await {
                    Ok(u) => Arc::new(u),
                    Err(e) => {
                        tracing::debug!(port = key.1, %endpoint, error = %e, "UDP session failed");
                        continue;
                    }
                };
                sessions.lock().insert(client, upstream.clone());
                tokio::spawn(udp_replies(
                    socket.clone(),
                    upstream.clone(),
                    client,
                    sessions.clone(),
                    stop.clone(),
                ));
                upstream
            }
        };
        if let Err(e) = upstream.send(&buffer[..len]).await {
            tracing::debug!(port = key.1, error = %e, "UDP datagram not relayed");
        }
    }
}

/// A socket connected to `endpoint`, on an ephemeral port of the matching family.
async fn udp_session(endpoint: SocketAddr) -> io::Result<UdpSocket> {
    let local: SocketAddr = match endpoint {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(endpoint).await?;
    Ok(socket)
}

/// Sends an endpoint's replies back to `client` until the session is idle for
/// [`UDP_IDLE_TIMEOUT`], then forgets it. Datagrams from the client count as activity: the
/// session is only dropped when neither side spoke.
async fn udp_replies(
    listener: Arc<UdpSocket>,
    upstream: Arc<UdpSocket>,
    client: SocketAddr,
    sessions: Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>>,
    stop: CancellationToken,
) {
    let mut buffer = vec![0u8; UDP_DATAGRAM_MAX];
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => break,
            r = tokio::time::timeout(UDP_IDLE_TIMEOUT, upstream.recv(&mut buffer)) => r,
        };
        match received {
            Ok(Ok(len)) => {
                if let Err(e) = listener.send_to(&buffer[..len], client).await {
                    tracing::debug!(%client, error = %e, "UDP reply not relayed");
                }
            }
            // An ICMP error from the endpoint (port unreachable): the session is over.
            Ok(Err(_)) => break,
            Err(_idle) => {
                // Idle both ways? The client's datagrams go out on `upstream` too, so a
                // session whose client still speaks has replies coming or sends pending;
                // kube-proxy's userspace proxy likewise ends a session on a read timeout.
                break;
            }
        }
    }
    let mut map = sessions.lock();
    if map.get(&client).is_some_and(|s| Arc::ptr_eq(s, &upstream)) {
        map.remove(&client);
    }
}

/// Wakes the sync loop on every informer event.
struct Wake(Arc<Notify>);

impl<K: Send + Sync + 'static> EventHandler<K> for Wake {
    fn on_add(&self, _: &Arc<K>, _: bool) {
        self.0.notify_one();
    }
    fn on_update(&self, _: &Arc<K>, _: &Arc<K>) {
        self.0.notify_one();
    }
    fn on_delete(&self, _: &Deleted<K>) {
        self.0.notify_one();
    }
}

/// Runs the localhost NodePort proxy until `stop`: informers on Services and EndpointSlices,
/// a sync of the listeners after every burst of changes.
pub async fn run(client: Client, stop: CancellationToken) {
    let services: SharedInformer<Service> = SharedInformer::new(client.api(None), None);
    let slices: SharedInformer<EndpointSlice> = SharedInformer::new(client.api(None), None);
    let wake = Arc::new(Notify::new());
    services.add_handler(Wake(wake.clone()));
    slices.add_handler(Wake(wake.clone()));
    services.run(stop.clone());
    slices.run(stop.clone());
    if !services.wait_for_sync(&stop).await || !slices.wait_for_sync(&stop).await {
        return;
    }
    let mut proxy = LocalhostProxy::new(stop.clone());
    loop {
        proxy.apply(desired(&services.store().list(), &slices.store().list()));
        tokio::select! {
            () = stop.cancelled() => return,
            () = wake.notified() => {}
        }
    }
}
