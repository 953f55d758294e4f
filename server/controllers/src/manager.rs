//! The controller manager: every controller of this crate in one task tree, run only while
//! this member holds the `kube-system/kube-controller-manager` Lease.
//!
//! As kube-controller-manager with `--use-service-account-credentials`, the shared informers
//! read with the manager's own identity (`system:kube-controller-manager`, which may list and
//! watch everything) while each controller writes with its own identity,
//! `system:serviceaccount:kube-system:<controller>`, bound by the bootstrap RBAC policy to
//! `system:controller:<controller>` — so a controller can do only what its role allows.
//! How such a client is made (a token, a certificate) is the caller's business:
//! [`ClientFor`].
//!
//! Leadership: one [`LeaderElector`] term at a time. When a term ends (renewals failed for the
//! renew deadline, or the member stops) every controller's token is cancelled, their queues
//! drain, the informers stop, and — unless the member is stopping — the manager campaigns
//! again. kube-controller-manager exits on lost leadership and relies on its supervisor to
//! restart it; skerry's one binary runs the apiserver too, so it starts over in-process with
//! fresh caches instead.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use skerry_client::Client;
use skerry_client::leaderelection::{Callbacks, LeaderElectionConfig, LeaderElector, RunOutcome};
use tokio_util::sync::CancellationToken;

use crate::context::{Context, DEFAULT_RESYNC, InformerFactory};
use crate::daemonset::DaemonSetController;
use crate::deployment::DeploymentController;
use crate::disruption::DisruptionController;
use crate::endpoints::EndpointsController;
use crate::endpointslice::EndpointSliceController;
use crate::garbagecollector::GarbageCollector;
use crate::namespace::NamespaceController;
use crate::nodeipam::{NodeIpamConfig, NodeIpamController};
use crate::nodelifecycle::NodeLifecycleController;
use crate::replicaset::ReplicaSetController;
use crate::rootcacertpublisher::RootCaCertPublisher;
use crate::serviceaccount::ServiceAccountController;
use crate::statefulset::StatefulSetController;

/// The Lease kube-controller-manager elects its leader on (`kube-system/kube-controller-manager`);
/// kept so that tools that read it (`kubectl get lease -n kube-system`) find the leader.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// See [`LEASE_NAMESPACE`].
pub const LEASE_NAME: &str = "kube-controller-manager";

/// kube-controller-manager's `--kube-api-qps` default since 1.27: each controller's client may
/// send 20 requests a second...
pub const CONTROLLER_QPS: f64 = 20.0;
/// ... and `--kube-api-burst` 30 at once.
pub const CONTROLLER_BURST: u32 = 30;

/// Workers per controller: kube-controller-manager's `--concurrent-*-syncs` defaults.
pub mod workers {
    /// `--concurrent-deployment-syncs`
    pub const DEPLOYMENT: usize = 5;
    /// `--concurrent-replicaset-syncs`
    pub const REPLICASET: usize = 5;
    /// `--concurrent-gc-syncs`
    pub const GARBAGE_COLLECTOR: usize = 20;
    /// `--concurrent-endpoint-syncs`
    pub const ENDPOINTS: usize = 5;
    /// `--concurrent-service-endpoint-syncs` (EndpointSlices)
    pub const ENDPOINTSLICE: usize = 5;
    /// `--concurrent-namespace-syncs`
    pub const NAMESPACE: usize = 10;
    /// The service-account controller's workers: kube-controller-manager starts it with 1
    /// (`--concurrent-serviceaccount-token-syncs` is the token controller's, not this one).
    pub const SERVICE_ACCOUNT: usize = 1;
    /// The root CA publisher's workers: kube-controller-manager starts it with 1.
    pub const ROOT_CA_CERT_PUBLISHER: usize = crate::rootcacertpublisher::DEFAULT_WORKERS;
    /// `--concurrent-daemonset-syncs`
    pub const DAEMONSET: usize = 2;
    /// `--concurrent-statefulset-syncs`
    pub const STATEFULSET: usize = 5;
    /// The node IPAM controller's workers (`cidrUpdateWorkers`).
    pub const NODE_IPAM: usize = crate::nodeipam::DEFAULT_WORKERS;
    /// The node lifecycle controller's workers (Kubernetes' node update workers: 8).
    pub const NODE_LIFECYCLE: usize = 8;
    /// The disruption controller's workers per queue: kube-controller-manager starts one
    /// worker on each of its queues and has no `--concurrent-*` flag for it. One is enough
    /// (a sync is a cache read and at most one status write) and keeps a budget's writes in
    /// order.
    pub const DISRUPTION: usize = 1;
}

/// Makes the client a controller writes with, given its service account's name in
/// `kube-system` (e.g. `replicaset-controller`).
pub type ClientFor = Arc<dyn Fn(&str) -> anyhow::Result<Client> + Send + Sync>;

/// The controllers' flags (kube-controller-manager's), for those that take any.
#[derive(Debug, Clone, Default)]
pub struct ManagerConfig {
    /// `--allocate-node-cidrs`, `--cluster-cidr`, `--node-cidr-mask-size`,
    /// `--service-cluster-ip-range`: the node IPAM controller.
    pub node_ipam: NodeIpamConfig,
    /// The cluster CA certificate (PEM) the root CA publisher puts in every namespace
    /// (kube-controller-manager's `--root-ca-file`, by default its own kubeconfig's CA).
    /// Required: the controllers do not start without it.
    pub root_ca_pem: String,
}

/// A running controller's future.
type Running = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Campaigns for the Lease with `identity` through `root` and runs every controller while
/// leading, until `stop`.
pub async fn run(
    root: Client,
    client_for: ClientFor,
    identity: String,
    controllers: ManagerConfig,
    stop: CancellationToken,
) {
    let config = LeaderElectionConfig::new(LEASE_NAMESPACE, LEASE_NAME, &identity);
    run_with(root, client_for, config, controllers, stop).await;
}

/// [`run`] with an explicit election configuration (tests shorten the timeouts).
pub async fn run_with(
    root: Client,
    client_for: ClientFor,
    mut config: LeaderElectionConfig,
    controllers: ManagerConfig,
    stop: CancellationToken,
) {
    // A stopping member hands the Lease back so another takes over without waiting out the
    // lease duration (client-go's ReleaseOnCancel).
    config.release_on_cancel = true;
    let retry = config.retry_period;
    let lead_root = root.clone();
    let identity = config.identity.clone();
    let callbacks = Callbacks::new(move |token| {
        let root = lead_root.clone();
        let client_for = client_for.clone();
        let controllers = controllers.clone();
        async move {
            if let Err(e) = lead(root, client_for, controllers, token).await {
                tracing::error!(error = %e, "controllers could not start");
            }
        }
    })
    .on_new_leader(move |holder| {
        tracing::info!(leader = holder, "kube-controller-manager leader");
    });
    let elector = match LeaderElector::for_client(&root, config, callbacks) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "controller manager: bad leader-election configuration");
            return;
        }
    };
    loop {
        let outcome = elector.run(&stop).await;
        tracing::info!(?outcome, %identity, "controller manager term ended");
        if stop.is_cancelled() {
            return;
        }
        debug_assert_eq!(outcome, RunOutcome::LostLeadership);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(retry) => {}
        }
    }
}

/// One term as leader: builds every controller over fresh shared informers, starts them,
/// and returns when `token` is cancelled and they have all stopped.
async fn lead(
    root: Client,
    client_for: ClientFor,
    config: ManagerConfig,
    token: CancellationToken,
) -> anyhow::Result<()> {
    let informers = InformerFactory::new(root, Some(DEFAULT_RESYNC));
    let ctx = |name: &str| -> anyhow::Result<Context> {
        Ok(Context {
            client: client_for(name)?,
            informers: informers.clone(),
        })
    };
    let running: Vec<(&'static str, Running)> = controllers(&ctx, &config, &token)?;
    informers.start(&token);
    tracing::info!(controllers = running.len(), "controllers started");
    let mut tasks = Vec::with_capacity(running.len());
    for (name, fut) in running {
        tasks.push((name, tokio::spawn(fut)));
    }
    for (name, task) in tasks {
        if let Err(e) = task.await {
            tracing::error!(controller = name, error = %e, "controller task failed");
        }
    }
    Ok(())
}

/// Every controller, constructed (informers and handlers registered) but not yet running.
fn controllers(
    ctx: &dyn Fn(&str) -> anyhow::Result<Context>,
    config: &ManagerConfig,
    token: &CancellationToken,
) -> anyhow::Result<Vec<(&'static str, Running)>> {
    let mut running: Vec<(&'static str, Running)> = Vec::new();
    // Each controller: its service account (its client's identity), its constructor and its
    // worker count. Constructing registers informers and handlers; nothing runs yet.
    macro_rules! controller {
        ($sa:literal, $ty:ty, $workers:expr) => {{
            let c = <$ty>::new(&ctx($sa)?);
            running.push(($sa, Box::pin(c.run($workers, token.clone()))));
        }};
    }
    controller!(
        "deployment-controller",
        DeploymentController,
        workers::DEPLOYMENT
    );
    controller!(
        "replicaset-controller",
        ReplicaSetController,
        workers::REPLICASET
    );
    controller!(
        "generic-garbage-collector",
        GarbageCollector,
        workers::GARBAGE_COLLECTOR
    );
    controller!(
        "node-controller",
        NodeLifecycleController,
        workers::NODE_LIFECYCLE
    );
    controller!(
        "namespace-controller",
        NamespaceController,
        workers::NAMESPACE
    );
    controller!(
        "service-account-controller",
        ServiceAccountController,
        workers::SERVICE_ACCOUNT
    );
    controller!(
        "endpoint-controller",
        EndpointsController,
        workers::ENDPOINTS
    );
    controller!(
        "endpointslice-controller",
        EndpointSliceController,
        workers::ENDPOINTSLICE
    );
    controller!(
        "daemon-set-controller",
        DaemonSetController,
        workers::DAEMONSET
    );
    controller!(
        "statefulset-controller",
        StatefulSetController,
        workers::STATEFULSET
    );
    controller!(
        "disruption-controller",
        DisruptionController,
        workers::DISRUPTION
    );
    // The publisher takes the CA it publishes (`startRootCACertPublisher`).
    if config.root_ca_pem.is_empty() {
        anyhow::bail!(
            "the root CA cert publisher needs the cluster CA (ManagerConfig::root_ca_pem)"
        );
    }
    let c = RootCaCertPublisher::new(&ctx("root-ca-cert-publisher")?, config.root_ca_pem.clone());
    running.push((
        "root-ca-cert-publisher",
        Box::pin(c.run(workers::ROOT_CA_CERT_PUBLISHER, token.clone())),
    ));
    // kube-controller-manager runs the node IPAM controller as the node controller's service
    // account (`startNodeIpamController`), and only with `--allocate-node-cidrs`.
    if config.node_ipam.allocate_node_cidrs {
        let c = NodeIpamController::new(&ctx("node-controller")?, config.node_ipam.clone());
        running.push((
            "nodeipam-controller",
            Box::pin(c.run(workers::NODE_IPAM, token.clone())),
        ));
    }
    Ok(running)
}
