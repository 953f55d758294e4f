//! The built-in service load balancer: LoadBalancer Services on an appliance with no cloud.
//!
//! k3s's ServiceLB publishes the addresses of the nodes that run its per-Service DaemonSet
//! pods as a LoadBalancer's ingress; skerry needs no pods for that, because every box already
//! answers NodePorts and, through the service proxy, the Service's port on its own addresses.
//! So this controller is only the status half of upstream's service controller contract
//! (`staging/src/k8s.io/cloud-provider/controllers/service/controller.go`): for every Service
//! of type LoadBalancer that no other implementation claims (`spec.loadBalancerClass`
//! unset), `status.loadBalancer.ingress` lists the Ready nodes' addresses — a node's
//! ExternalIPs when it has any, else its InternalIPs — kept in step as nodes come, go or turn
//! NotReady; a Service that stops being a LoadBalancer has its ingress cleared
//! (`needsCleanup`).
//!
//! One writer per cluster: the three boxes each run this, and a Lease election
//! ([`skerry_client::leaderelection`]) picks the one that writes, so the boxes never
//! fight over a status.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::{Value, json};
use skerry_client::Client;
use skerry_client::api::{Patch, PatchParams};
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::leaderelection::{Callbacks, LeaderElectionConfig, LeaderElector};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The Lease the boxes elect the writer with, in `kube-system` beside the control plane's.
pub const LEASE_NAME: &str = "skerry-servicelb";

/// The namespace of the Lease (where kube-controller-manager's and the scheduler's are).
pub const LEASE_NAMESPACE: &str = "kube-system";

/// How long a failed status write waits before the next sync tries again: the service
/// controller's `minRetryDelay` (5 s) is for cloud calls; a status PATCH to the local
/// apiserver can retry sooner.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// This box's identity in the election (its node name).
    pub identity: String,
    /// The election's timeouts (client-go's defaults from [`Config::new`]).
    pub election: LeaderElectionConfig,
}

impl Config {
    /// client-go's election defaults, on [`LEASE_NAME`] in [`LEASE_NAMESPACE`].
    pub fn new(identity: &str) -> Config {
        Config {
            identity: identity.to_string(),
            election: LeaderElectionConfig::new(LEASE_NAMESPACE, LEASE_NAME, identity),
        }
    }
}

/// Whether a node counts: its `Ready` condition is `True` and it is not being deleted.
fn node_ready(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
}

/// A node's addresses for a load balancer: its ExternalIPs, or its InternalIPs without any.
fn node_addresses(node: &Node) -> Vec<String> {
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let of = |kind: &str| -> Vec<String> {
        addresses
            .iter()
            .filter(|a| a.type_ == kind)
            .map(|a| a.address.clone())
            .collect()
    };
    let external = of("ExternalIP");
    if external.is_empty() {
        of("InternalIP")
    } else {
        external
    }
}

/// The ingress every unclaimed LoadBalancer gets: the Ready nodes' addresses, sorted so the
/// status does not churn with the order nodes are listed in.
pub fn ingress(nodes: &[Arc<Node>]) -> Vec<String> {
    let set: BTreeSet<String> = nodes
        .iter()
        .filter(|n| node_ready(n))
        .flat_map(|n| node_addresses(n))
        .collect();
    set.into_iter().collect()
}

/// What a Service's ingress should be: `Some(ips)` to publish (empty to clear), `None` when
/// the Service is not this controller's to touch.
pub fn wanted(service: &Service, ingress: &[String]) -> Option<Vec<String>> {
    let spec = service.spec.as_ref()?;
    if spec.load_balancer_class.is_some() {
        // Another implementation's (MetalLB, a cloud's): never touched.
        return None;
    }
    if spec.type_.as_deref() == Some("LoadBalancer") {
        Some(ingress.to_vec())
    } else {
        Some(Vec::new())
    }
}

/// A Service's published ingress IPs.
fn published(service: &Service) -> Vec<String> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ingress| ingress.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

/// The status merge patch that publishes `ips` (or clears the ingress when empty).
fn status_patch(ips: &[String]) -> Value {
    if ips.is_empty() {
        return json!({"status": {"loadBalancer": {"ingress": null}}});
    }
    let ingress: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
        .collect();
    json!({"status": {"loadBalancer": {"ingress": ingress}}})
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

/// Runs the service load balancer until `stop`: campaigns for the Lease, and while leading
/// keeps every LoadBalancer's ingress in step with the Ready nodes.
pub async fn run(client: Client, config: Config, stop: CancellationToken) {
    let mut election = config.election.clone();
    election.identity = config.identity.clone();
    election.release_on_cancel = true;
    let retry = election.retry_period;
    let lead_client = client.clone();
    let callbacks = Callbacks::new(move |token| lead(lead_client.clone(), token))
        .on_new_leader(|holder| tracing::info!(leader = holder, "service load balancer leader"));
    let elector = match LeaderElector::for_client(&client, election, callbacks) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "service load balancer: bad leader-election configuration");
            return;
        }
    };
    loop {
        let outcome = elector.run(&stop).await;
        tracing::info!(?outcome, "service load balancer term ended");
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(retry) => {}
        }
    }
}

/// One term as the writer: informers on Services and Nodes, a sync after every change.
async fn lead(client: Client, token: CancellationToken) {
    let services: SharedInformer<Service> = SharedInformer::new(client.api(None), None);
    let nodes: SharedInformer<Node> = SharedInformer::new(client.api(None), None);
    let wake = Arc::new(Notify::new());
    services.add_handler(Wake(wake.clone()));
    nodes.add_handler(Wake(wake.clone()));
    services.run(token.clone());
    nodes.run(token.clone());
    if !services.wait_for_sync(&token).await || !nodes.wait_for_sync(&token).await {
        return;
    }
    loop {
        let complete = sync(&client, &services.store().list(), &nodes.store().list()).await;
        let pause = async {
            if complete {
                wake.notified().await;
            } else {
                tokio::time::sleep(RETRY_DELAY).await;
            }
        };
        tokio::select! {
            () = token.cancelled() => return,
            () = pause => {}
        }
    }
}

/// Writes every Service whose published ingress differs from what it should be. Returns
/// whether every write succeeded.
async fn sync(client: &Client, services: &[Arc<Service>], nodes: &[Arc<Node>]) -> bool {
    let ingress = ingress(nodes);
    let mut complete = true;
    for service in services {
        let Some(want) = wanted(service, &ingress) else {
            continue;
        };
        if published(service) == want {
            continue;
        }
        let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
        let name = service.metadata.name.as_deref().unwrap_or("");
        let api = client.api::<Service>(Some(namespace));
        let patch = Patch::Merge(status_patch(&want));
        match api
            .patch_status(name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => tracing::info!(namespace, name, ingress = ?want, "load balancer ingress"),
            Err(e) => {
                tracing::warn!(namespace, name, error = %e, "load balancer ingress not written");
                complete = false;
            }
        }
    }
    complete
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ready: &str, addresses: &[(&str, &str)]) -> Arc<Node> {
        let addresses: Vec<Value> = addresses
            .iter()
            .map(|(t, a)| json!({"type": t, "address": a}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name},
                "status": {"conditions": [{"type": "Ready", "status": ready}], "addresses": addresses}}))
            .expect("node"),
        )
    }

    fn service(spec: Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "d"}, "spec": spec}))
            .expect("service")
    }

    #[test]
    fn ready_nodes_give_their_external_or_internal_addresses() {
        let nodes = [
            node(
                "a",
                "True",
                &[("InternalIP", "10.0.0.2"), ("Hostname", "a")],
            ),
            node(
                "b",
                "True",
                &[("InternalIP", "10.0.0.3"), ("ExternalIP", "203.0.113.3")],
            ),
            node("c", "False", &[("InternalIP", "10.0.0.4")]),
            node("d", "Unknown", &[("InternalIP", "10.0.0.5")]),
        ];
        assert_eq!(ingress(&nodes), ["10.0.0.2", "203.0.113.3"]);
    }

    #[test]
    fn only_unclaimed_load_balancers_are_published_and_others_cleared() {
        let ips = vec!["10.0.0.2".to_string()];
        let lb = service(json!({"type": "LoadBalancer"}));
        assert_eq!(wanted(&lb, &ips), Some(ips.clone()));
        let cluster_ip = service(json!({"type": "ClusterIP"}));
        assert_eq!(wanted(&cluster_ip, &ips), Some(Vec::new()));
        let metallb = service(json!({"type": "LoadBalancer", "loadBalancerClass": "metallb.io/x"}));
        assert_eq!(wanted(&metallb, &ips), None);
        assert_eq!(
            status_patch(&[]),
            json!({"status": {"loadBalancer": {"ingress": null}}})
        );
    }
}
