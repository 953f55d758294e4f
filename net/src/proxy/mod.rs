//! The service proxy, nftables backend (issue 20; `docs/tricks.md` #33 and the proxy half of
//! #35): Services and EndpointSlices watched with informers, one nftables table per family
//! (`ip skerry-proxy`, `ip6 skerry-proxy`) written with one `nft -f` transaction per sync.
//!
//! - [`model`]: the objects read defensively, and upstream's `CategorizeEndpoints` (ready,
//!   else serving-and-terminating endpoints; topology hints only when every endpoint has
//!   one, #35);
//! - [`rules`]: the pure generator (one `numgen random mod N vmap` rule per Service port,
//!   #33; the `service-ips` / `service-nodeports` verdict maps);
//! - [`sync`]: full and partial syncs, stale chains, the drift check;
//! - [`metrics`]: kube-proxy's metric names;
//! - [`run`]: the informers and the bounded runner (upstream's `BoundedFrequencyRunner`:
//!   changes in a burst coalesce into one sync at most every `min_sync_period`, and a sync
//!   happens at least every [`SYNC_PERIOD`]).
//!
//! The masquerade of traffic leaving the cluster CIDR is not here (the routes module's), nor
//! are NodePorts on localhost, which nftables cannot DNAT (#33's userspace proxy).

pub mod metrics;
pub mod model;
pub mod rules;
pub mod sync;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use parking_lot::Mutex;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::{Client, key_of};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use metrics::ProxyMetrics;
pub use model::Family;
pub use rules::RuleConfig;
pub use sync::{Nft, SyncReport, Syncer};

/// kube-proxy's default `--min-sync-period` for nftables: 1 s (`pkg/proxy/apis/config`
/// defaults, `MinSyncPeriod`).
pub const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);
/// kube-proxy's `--nftables-sync-period` default, 30 s: the longest time between syncs (each
/// checks for drift and deletes stale chains).
pub const SYNC_PERIOD: Duration = Duration::from_secs(30);

/// What the proxy needs to know of its node.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// This node's name (endpoints with this `nodeName` are local).
    pub node_name: String,
    /// This node's addresses: NodePorts answer on them.
    pub node_ips: Vec<IpAddr>,
    /// The cluster (pod) CIDRs, at most one per family (`10.42.0.0/16`).
    pub cluster_cidrs: Vec<String>,
    /// This node's `topology.kubernetes.io/zone`, if any.
    pub zone: Option<String>,
    /// The `nft` command: an argv prefix (`["nft"]`).
    pub nft: Vec<String>,
    /// The shortest time between two syncs.
    pub min_sync_period: Duration,
}

impl ProxyConfig {
    /// The rule configuration of `family`.
    pub fn rule_config(&self, family: Family) -> RuleConfig {
        let cidr = self.cluster_cidrs.iter().find(|c| {
            c.split('/')
                .next()
                .and_then(|a| a.parse::<IpAddr>().ok())
                .is_some_and(|a| Family::of(&a) == family)
        });
        RuleConfig {
            node_ips: self
                .node_ips
                .iter()
                .filter(|i| Family::of(i) == family)
                .copied()
                .collect(),
            cluster_cidr: cidr.cloned(),
            zone: self.zone.clone(),
        }
    }
}

/// The syncers of both families and the metrics, shared by the handlers and the runner.
pub struct Proxy {
    syncers: Mutex<Vec<Syncer>>,
    metrics: ProxyMetrics,
    wake: Notify,
}

impl Proxy {
    /// A proxy for `config`'s node, both families.
    pub fn new(config: &ProxyConfig) -> Proxy {
        let nft = Nft::new(config.nft.clone());
        let syncers = [Family::V4, Family::V6]
            .into_iter()
            .map(|f| {
                Syncer::new(
                    f,
                    config.rule_config(f),
                    config.node_name.clone(),
                    nft.clone(),
                )
            })
            .collect();
        Proxy {
            syncers: Mutex::new(syncers),
            metrics: ProxyMetrics::new(),
            wake: Notify::new(),
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &ProxyMetrics {
        &self.metrics
    }

    /// A Service event.
    pub fn on_service(&self, old: Option<&Service>, new: Option<&Service>) {
        let mut changed = false;
        for s in self.syncers.lock().iter_mut() {
            changed |= s.update_service(old, new);
        }
        if changed {
            self.metrics.service_changed();
            self.wake.notify_one();
        }
    }

    /// An EndpointSlice event.
    pub fn on_slice(&self, key: &str, slice: Option<&EndpointSlice>) {
        let mut changed = false;
        for s in self.syncers.lock().iter_mut() {
            changed |= s.update_slice(key, slice);
        }
        if changed {
            self.metrics.endpoints_changed();
            self.wake.notify_one();
        }
    }

    /// Syncs both families now; `true` when flushed chains wait to be deleted, for the
    /// runner to come back after [`sync::STALE_CHAIN_DELAY`].
    pub fn sync_now(&self) -> anyhow::Result<bool> {
        let mut syncers = self.syncers.lock();
        let mut stale = false;
        let mut first_err = None;
        for s in syncers.iter_mut() {
            let start = Instant::now();
            match s.sync() {
                Ok(report) => {
                    self.metrics.synced(start.elapsed(), &report);
                    stale |= report.stale_pending > 0;
                }
                Err(e) => {
                    self.metrics.failed();
                    warn!(family = ?s.family(), error = %e, "proxy sync failed");
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(stale),
        }
    }
}

struct ServiceHandler(Arc<Proxy>);

impl EventHandler<Service> for ServiceHandler {
    fn on_add(&self, obj: &Arc<Service>, _: bool) {
        self.0.on_service(None, Some(obj));
    }
    fn on_update(&self, old: &Arc<Service>, new: &Arc<Service>) {
        self.0.on_service(Some(old), Some(new));
    }
    fn on_delete(&self, obj: &Deleted<Service>) {
        self.0.on_service(Some(obj.object()), None);
    }
}

struct SliceHandler(Arc<Proxy>);

impl EventHandler<EndpointSlice> for SliceHandler {
    fn on_add(&self, obj: &Arc<EndpointSlice>, _: bool) {
        self.0.on_slice(&key_of(obj.as_ref()), Some(obj));
    }
    fn on_update(&self, _: &Arc<EndpointSlice>, new: &Arc<EndpointSlice>) {
        self.0.on_slice(&key_of(new.as_ref()), Some(new));
    }
    fn on_delete(&self, obj: &Deleted<EndpointSlice>) {
        self.0.on_slice(&key_of(obj.object().as_ref()), None);
    }
}

/// Runs the proxy until `stop`: informers on Services and EndpointSlices, a full sync once
/// both have listed, then syncs as changes come (at most one per `min_sync_period`, at least
/// one per [`SYNC_PERIOD`]). [`run_with`] also hands out the [`Proxy`] for its metrics.
pub async fn run(
    client: Client,
    config: ProxyConfig,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    run_with(client, config, stop, |_| {}).await
}

/// [`run`], handing the [`Proxy`] (its metrics) to `started` first.
pub async fn run_with(
    client: Client,
    config: ProxyConfig,
    stop: CancellationToken,
    started: impl FnOnce(Arc<Proxy>),
) -> anyhow::Result<()> {
    let proxy = Arc::new(Proxy::new(&config));
    started(proxy.clone());
    let services: SharedInformer<Service> = SharedInformer::new(client.api::<Service>(None), None);
    let slices: SharedInformer<EndpointSlice> =
        SharedInformer::new(client.api::<EndpointSlice>(None), None);
    services.add_handler(ServiceHandler(proxy.clone()));
    slices.add_handler(SliceHandler(proxy.clone()));
    services.run(stop.clone());
    slices.run(stop.clone());
    if !services.wait_for_sync(&stop).await || !slices.wait_for_sync(&stop).await {
        return Ok(());
    }
    info!(node = %config.node_name, "service proxy: informers synced, first full sync");
    let min = config.min_sync_period;
    let mut last: Option<Instant> = None;
    let mut retry: Option<Duration> = None;
    loop {
        if let Some(last) = last {
            let wait = retry.unwrap_or(SYNC_PERIOD);
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = proxy.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
            // Bounded frequency: a burst of changes waits out the minimum period and is
            // synced as one.
            let since = last.elapsed();
            if since < min {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(min - since) => {}
                }
            }
        }
        last = Some(Instant::now());
        let p = proxy.clone();
        let result = tokio::task::spawn_blocking(move || p.sync_now()).await?;
        retry = match result {
            Ok(true) => Some(sync::STALE_CHAIN_DELAY),
            Ok(false) => None,
            Err(_) => Some(min.max(sync::STALE_CHAIN_DELAY)),
        };
    }
}
