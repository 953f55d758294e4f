//! The node's heartbeat: the Lease `kube-node-lease/<node>`, renewed every 10 s, as the
//! upstream kubelet's lease controller renews it (`component-helpers/apimachinery/lease/
//! controller.go`; the kubelet's settings in `pkg/kubelet/kubelet.go`). The node lifecycle
//! controller reads its `renewTime` to tell a live node from a lost one, so a cheap write
//! every 10 s replaces posting the whole node status.
//!
//! A renewal is an update (PUT) of the Lease last written, with its resourceVersion: no GET
//! while nothing else writes it. On a conflict the Lease is read again; on any other failure
//! the update is retried at once, five times in all (`maxUpdateRetries`), then the next
//! period tries again from a fresh read. Reading or creating the Lease backs off from 200 ms
//! doubling to 7 s (`backoffEnsureLease`). The Lease is owned by the Node (an owner reference
//! with the Node's UID, added as soon as the Node can be read), so deleting the Node lets the
//! garbage collector delete its Lease.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use rand::Rng;
use skerry_client::{Api, Client, PostParams};
use tokio_util::sync::CancellationToken;

/// The namespace of node Leases (`v1.NamespaceNodeLease`).
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The kubelet's `nodeLeaseDurationSeconds` default: the node lifecycle controller's grace
/// period is counted against this.
pub const NODE_LEASE_DURATION_SECONDS: i32 = 40;
/// The renewal period: a quarter of the duration (`kubelet.go`,
/// `nodeLeaseRenewIntervalFraction` 0.25), so three renewals can fail before the Lease runs
/// out.
pub const NODE_LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(10);
/// Jitter added to each period (`wait.JitterUntil(..., 0.04, ...)`): up to 4 % more, so the
/// nodes of a cluster rebooted together do not renew in lock step.
pub const RENEW_JITTER: f64 = 0.04;
/// Immediate update retries per period (`maxUpdateRetries`).
pub const MAX_UPDATE_RETRIES: usize = 5;
/// The first pause of [`NodeLease::ensure`] after a failure: 100 ms doubled once, as
/// upstream doubles before its first sleep.
pub const ENSURE_BACKOFF_START: Duration = Duration::from_millis(100);
/// The longest pause between attempts to read or create the Lease (`maxBackoff`).
pub const ENSURE_BACKOFF_MAX: Duration = Duration::from_secs(7);

/// The Lease's timing.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: i32,
    /// How often the Lease is renewed.
    pub renew_interval: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            duration_seconds: NODE_LEASE_DURATION_SECONDS,
            renew_interval: NODE_LEASE_RENEW_INTERVAL,
        }
    }
}

/// The node Lease's renewer.
pub struct NodeLease {
    node_name: String,
    leases: Api<Lease>,
    nodes: Api<Node>,
    config: LeaseConfig,
    /// The Lease as last written: the base of the next update.
    latest: Option<Lease>,
}

impl NodeLease {
    /// A renewer of `kube-node-lease/<node_name>` through `client`.
    pub fn new(client: &Client, node_name: &str, config: LeaseConfig) -> NodeLease {
        NodeLease {
            node_name: node_name.to_string(),
            leases: client.api::<Lease>(Some(NODE_LEASE_NAMESPACE)),
            nodes: client.api::<Node>(None),
            config,
            latest: None,
        }
    }

    /// Renews the Lease every period (plus jitter) until `stop`; the first renewal at once.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.sync(&stop) => {}
            }
            let jitter = rand::rng().random_range(0.0..=RENEW_JITTER);
            let period = self.config.renew_interval.mul_f64(1.0 + jitter);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
        }
    }

    /// One period: update from the last written Lease; failing that, read (or create) it
    /// and update that.
    pub async fn sync(&mut self, stop: &CancellationToken) {
        if let Some(latest) = self.latest.clone() {
            match self.retry_update(latest, stop).await {
                Ok(()) => return,
                Err(e) => tracing::info!(
                    node = %self.node_name,
                    error = %e,
                    "failed to update lease using latest lease, fallback to ensure lease"
                ),
            }
        }
        let Some((lease, created)) = self.backoff_ensure(stop).await else {
            self.latest = None;
            return;
        };
        self.latest = Some(lease.clone());
        if !created && let Err(e) = self.retry_update(lease, stop).await {
            tracing::error!(node = %self.node_name, error = %e, "node lease not renewed; will retry next period");
        }
    }

    /// Up to [`MAX_UPDATE_RETRIES`] updates; a conflict re-reads the Lease first.
    async fn retry_update(
        &mut self,
        mut base: Lease,
        stop: &CancellationToken,
    ) -> Result<(), String> {
        for _ in 0..MAX_UPDATE_RETRIES {
            let (lease, _) = self.renewed(Some(base.clone())).await;
            match self
                .leases
                .replace(&self.node_name, &PostParams::default(), &lease)
                .await
            {
                Ok(written) => {
                    self.latest = Some(written);
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(node = %self.node_name, error = %e, "failed to update lease");
                    if e.is_conflict() {
                        match self.backoff_ensure(stop).await {
                            Some((fresh, _)) => base = fresh,
                            None => return Err("stopped".into()),
                        }
                    }
                }
            }
        }
        Err(format!(
            "failed {MAX_UPDATE_RETRIES} attempts to update lease"
        ))
    }

    /// Reads the Lease, creating it when missing, with backoff until it works or `stop`.
    /// Returns the Lease and whether this call created it; `None` when stopped, or when the
    /// Lease is missing and the Node cannot be read yet (upstream creates no Lease it cannot
    /// give its owner: the next period tries again).
    async fn backoff_ensure(&mut self, stop: &CancellationToken) -> Option<(Lease, bool)> {
        let mut sleep = ENSURE_BACKOFF_START;
        loop {
            match self.ensure().await {
                Ok(found) => return found,
                Err(e) => {
                    sleep = (sleep * 2).min(ENSURE_BACKOFF_MAX);
                    tracing::error!(node = %self.node_name, error = %e, retry_in = ?sleep, "failed to ensure node lease exists");
                    tokio::select! {
                        () = stop.cancelled() => return None,
                        () = tokio::time::sleep(sleep) => {}
                    }
                }
            }
        }
    }

    async fn ensure(&mut self) -> Result<Option<(Lease, bool)>, skerry_client::Error> {
        match self.leases.get_opt(&self.node_name).await? {
            Some(lease) => Ok(Some((lease, false))),
            None => {
                let (lease, owned) = self.renewed(None).await;
                if !owned {
                    return Ok(None);
                }
                let created = self.leases.create(&PostParams::default(), &lease).await?;
                Ok(Some((created, true)))
            }
        }
    }

    /// `base` (or a new Lease) with `renewTime` now, and the owner reference to the Node
    /// added when missing and the Node readable; with whether the Lease has its owner.
    async fn renewed(&self, base: Option<Lease>) -> (Lease, bool) {
        let mut lease = base.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                namespace: Some(NODE_LEASE_NAMESPACE.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.node_name.clone()),
                lease_duration_seconds: Some(self.config.duration_seconds),
                ..LeaseSpec::default()
            }),
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        if lease
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(Vec::is_empty)
        {
            match self.nodes.get(&self.node_name).await {
                Ok(node) => {
                    if let Some(uid) = node.metadata.uid {
                        lease.metadata.owner_references = Some(vec![OwnerReference {
                            api_version: "v1".to_string(),
                            kind: "Node".to_string(),
                            name: self.node_name.clone(),
                            uid,
                            ..OwnerReference::default()
                        }]);
                    }
                }
                // Registration may not have happened yet: the next renewal tries again.
                Err(e) => {
                    tracing::debug!(node = %self.node_name, error = %e, "node not readable for the lease's owner reference")
                }
            }
        }
        let owned = lease
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| !o.is_empty());
        (lease, owned)
    }
}
