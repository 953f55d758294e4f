//! The pod network across boxes (issue 20): every node routes each other node's podCIDRs to
//! that node's InternalIP — flannel's host-gw model, no overlay on one L2 segment — and
//! masquerades what leaves the cluster's pod ranges ([`masq`]).
//!
//! The trick: level-triggered reconciliation of a routing table shared with others. Our routes
//! carry a routing protocol number of our own ([`ip::RT_PROTO`]); each sync lists the table,
//! computes from the Node objects the routes that should exist ([`plan`]), and changes only
//! routes with our number. So a route an administrator or another daemon installed is never
//! touched (a destination it already covers is left to it), and a route of ours no Node wants
//! any more — its node deleted, its range or address changed, or left over from before a
//! restart — is found and removed by the same comparison, with no state kept on disk.
//!
//! Syncs run when a Node's routing view (InternalIPs, podCIDRs) changes, through a shared
//! informer, and every [`CHECK_PERIOD`] besides, which also repairs routes and the NAT table
//! someone else deleted.
//!
//! A peer on no subnet of our link (behind a router) is reached through the VXLAN overlay
//! instead ([`vxlan`], flannel's `vxlan` backend with `DirectRouting`): same segment, plain
//! routes; another segment, the tunnel. Where the kernel has no VXLAN, such a peer's ranges are
//! logged as unroutable on every sync ([`plan::Plan::unroutable`]) rather than routed badly.
//!
//! Routes and the table are changed with iproute2's `ip` and `nft` (`-json` to read), not
//! netlink from Rust: see [`ip`].

pub mod ip;
pub mod masq;
pub mod plan;
pub mod vxlan;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use skerry_client::Client;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use plan::{Cidr, Overlay, Peer, Plan};

/// How often the table is compared with the Nodes without any Node changing: flannel's
/// host-gw backend re-checks its routes every 10 s (`pkg/backend/route_network.go`,
/// `routeCheck`), which repairs a route deleted by hand within seconds at the cost of
/// two `ip -json route show` a period.
pub const CHECK_PERIOD: Duration = Duration::from_secs(10);

/// What a node's routing needs to know.
#[derive(Debug, Clone)]
pub struct RoutesConfig {
    /// This node's name: its own Node gets no route.
    pub node_name: String,
    /// The cluster's pod ranges (`--cluster-cidr`, one per family): traffic from them to
    /// outside them is masqueraded.
    pub cluster_cidrs: Vec<Cidr>,
    /// This node's InternalIP.
    pub node_ip: IpAddr,
    /// The link peers are reached on; `None`: the link holding `node_ip`.
    pub link: Option<String>,
}

/// Why routing could not start or a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum RoutesError {
    #[error(transparent)]
    Ip(#[from] ip::IpError),
    #[error(transparent)]
    Masq(#[from] masq::MasqError),
    #[error("no link holds the node address {0}")]
    NoLink(IpAddr),
}

/// What one sync did.
#[derive(Debug, Default, Clone)]
pub struct SyncReport {
    /// The plan carried out.
    pub plan: Plan,
    /// Route changes that failed (the next sync tries again).
    pub errors: Vec<String>,
}

/// Brings the calling thread's network namespace's main table in line with a set of Nodes.
#[derive(Debug, Clone)]
pub struct Reconciler {
    node_name: String,
    link: String,
    /// The overlay device's spec; `None` when the overlay could not be created (no VXLAN in
    /// the kernel): off-link peers are then unroutable.
    overlay: Option<vxlan::Device>,
}

impl Reconciler {
    /// A reconciler for `config`, resolving the link when the config names none, and the
    /// overlay device created (a kernel without VXLAN gets a warning and no overlay).
    pub fn new(config: &RoutesConfig) -> Result<Reconciler, RoutesError> {
        let link = match &config.link {
            Some(l) => l.clone(),
            None => ip::link_of(config.node_ip)?.ok_or(RoutesError::NoLink(config.node_ip))?,
        };
        let device = vxlan::Device {
            local: config.node_ip,
            link: link.clone(),
        };
        let overlay = match device.ensure() {
            Ok(()) => Some(device),
            Err(e) => {
                warn!(error = %e, "no VXLAN overlay: nodes on other segments stay unreachable");
                None
            }
        };
        Ok(Reconciler {
            node_name: config.node_name.clone(),
            link,
            overlay,
        })
    }

    /// The overlay device's name, when there is one.
    pub fn overlay(&self) -> Option<&str> {
        self.overlay.as_ref().map(|_| vxlan::DEVICE)
    }

    /// The link routes go out of.
    pub fn link(&self) -> &str {
        &self.link
    }

    /// One sync against `nodes`: list, plan, apply. A failed change is reported and the rest
    /// still applied; a failed listing fails the sync.
    pub fn sync(&self, nodes: &[Arc<Node>]) -> Result<SyncReport, RoutesError> {
        let peers: Vec<Peer> = nodes.iter().map(|n| Peer::from_node(n)).collect();
        self.sync_peers(&peers)
    }

    /// [`Reconciler::sync`] over peers already read off their Nodes.
    pub fn sync_peers(&self, peers: &[Peer]) -> Result<SyncReport, RoutesError> {
        let mut errors = Vec::new();
        // The overlay first: its device (recreated if someone deleted or changed it), its
        // addresses and entries, so the routes written below find their gateways' MACs.
        let overlay = self.overlay.as_ref().and_then(|d| match d.ensure() {
            Ok(()) => Some(Overlay {
                dev: vxlan::DEVICE.to_string(),
                local: d.local,
            }),
            Err(e) => {
                errors.push(e.to_string());
                None
            }
        });
        let prefixes = ip::link_prefixes(&self.link)?;
        let (ours, others) = ip::list_routes()?;
        let plan = plan::plan(
            &self.node_name,
            &self.link,
            &prefixes,
            peers,
            &ours,
            &others,
            overlay.as_ref(),
        );
        if overlay.is_some() {
            if let Err(e) = vxlan::sync_addresses(&plan.own_ranges) {
                errors.push(e.to_string());
            }
            match vxlan::sync_entries(&plan.vteps) {
                Ok(r) if r != vxlan::EntriesReport::default() => {
                    info!(
                        written = r.written,
                        removed = r.removed,
                        "overlay entries synced"
                    )
                }
                Ok(_) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        for dst in &plan.remove {
            match ip::remove(*dst) {
                Ok(()) => info!(%dst, "route removed"),
                Err(e) => errors.push(e.to_string()),
            }
        }
        for route in &plan.install {
            match ip::install(route) {
                Ok(()) => {
                    info!(dst = %route.dst, via = %route.gateway, dev = %route.dev, onlink = route.onlink, "route installed")
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        Ok(SyncReport { plan, errors })
    }
}

/// Wakes the sync loop when a Node's routing view changes.
struct Wake(Arc<Notify>);

impl EventHandler<Node> for Wake {
    fn on_add(&self, _: &Arc<Node>, _: bool) {
        self.0.notify_one();
    }
    fn on_update(&self, old: &Arc<Node>, new: &Arc<Node>) {
        // Status heartbeats change conditions, not addresses or ranges: no sync for them.
        if Peer::from_node(old) != Peer::from_node(new) {
            self.0.notify_one();
        }
    }
    fn on_delete(&self, _: &Deleted<Node>) {
        self.0.notify_one();
    }
}

/// Runs the node's routing until `stop`: forwarding on, the masquerade table written, then
/// the routes kept in step with the Nodes. Routes and the table stay when it stops, so pods
/// keep talking across a restart; the next start's first sync removes what went stale.
pub async fn run(
    client: Client,
    config: RoutesConfig,
    stop: CancellationToken,
) -> Result<(), RoutesError> {
    let cidrs = config.cluster_cidrs.clone();
    masq::enable_forwarding(&cidrs)?;
    masq::apply(&cidrs)?;
    let reconciler = Arc::new(Reconciler::new(&config)?);
    info!(node = %config.node_name, link = %reconciler.link(), overlay = ?reconciler.overlay(), "pod routes starting");
    let informer = SharedInformer::<Node>::new(client.api::<Node>(None), None);
    let wake = Arc::new(Notify::new());
    informer.add_handler(Wake(wake.clone()));
    informer.run(stop.clone());
    if !informer.wait_for_sync(&stop).await {
        return Ok(());
    }
    loop {
        let nodes = informer.store().list();
        let (r, c) = (reconciler.clone(), cidrs.clone());
        let done = tokio::task::spawn_blocking(move || {
            if !masq::present(&c) {
                warn!("the masquerade table was gone; writing it again");
                masq::apply(&c)?;
            }
            r.sync(&nodes)
        })
        .await;
        match done {
            Ok(Ok(report)) => {
                for u in &report.plan.unroutable {
                    warn!(node = %u.node, dst = %u.dst, why = %u.why, "no route to a node's pods");
                }
                for e in &report.errors {
                    warn!(error = %e, "route change failed");
                }
            }
            Ok(Err(e)) => warn!(error = %e, "route sync failed"),
            Err(e) => warn!(error = %e, "route sync panicked"),
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = wake.notified() => {}
            _ = tokio::time::sleep(CHECK_PERIOD) => {}
        }
    }
}
