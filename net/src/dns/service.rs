//! The `kube-system/kube-dns` Service and its EndpointSlice: how pods reach the DNS server
//! every node runs.
//!
//! kubeadm installs CoreDNS as a Deployment behind a `kube-dns` Service with a selector; here
//! the server is part of every node, so the Service is selectorless (no EndpointSlice
//! controller writes its slice) and this controller writes the one slice itself: every Ready
//! node's InternalIP on port 53, with its `nodeName`. It runs in the control plane with admin
//! credentials, one leader at a time (a Lease in `kube-system`), and reconciles level by level:
//! on every Node event and every [`RESYNC`] it makes the Service and the slice what they should
//! be, recreating what was deleted and reverting what was edited (only the fields it owns).
//!
//! `internalTrafficPolicy: Local`. Every node serves DNS, so a node that is Ready always has
//! its own endpoint, and with `Local` a pod's query goes to the server on its own box and never
//! crosses to another. That keeps the latency at one local hop, and above all it keeps a box
//! that is cut off from the others resolving: its server answers from its own informer caches
//! (stale, but there) and its own forwarder, while with `Cluster` two queries in three would be
//! sent to boxes it cannot reach and time out in the pod's resolver. The price: on a node whose
//! own proxy sees no endpoint of itself (it is NotReady in the slice it last saw), its pods
//! get no DNS — but such a node's pods are being evicted anyway.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use skerry_client::cache::Indexer;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::leaderelection::{Callbacks, LeaderElectionConfig, LeaderElector};
use skerry_client::{Api, Client, PostParams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{DNS_PORT, DnsConfig};

/// The Service's namespace and name: kubeadm's, which every manifest and tool expects.
pub const NAMESPACE: &str = "kube-system";
/// See [`NAMESPACE`].
pub const SERVICE_NAME: &str = "kube-dns";
/// The name of the one EndpointSlice (a fixed name: there is only ever one, and a fixed name
/// makes a create after a lost answer a 409 rather than a duplicate).
pub const SLICE_NAME: &str = "kube-dns-skerry";
/// The label kubeadm's kube-dns Service carries (`k8s-app: kube-dns`).
pub const APP_LABEL: (&str, &str) = ("k8s-app", "kube-dns");
/// The label naming a slice's Service (`discovery.LabelServiceName`).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming a slice's manager (`discovery.LabelManagedBy`).
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// This controller's value of [`MANAGED_BY_LABEL`]: not the EndpointSlice controller's, so
/// that controller (and the mirroring one) leave the slice alone.
pub const MANAGED_BY: &str = "cluster-dns.skerry.io";
/// The Lease the controller's leader holds.
pub const LEASE_NAME: &str = "skerry-kube-dns";
/// kube-dns's metrics port (CoreDNS's `prometheus :9153`, kubeadm's Service port `metrics`).
pub const METRICS_PORT: u16 = 9153;
/// How often the leader re-checks the Service and the slice without an event: someone else's
/// edit or deletion of them is not watched, and this bounds how long it stands.
pub const RESYNC: Duration = Duration::from_secs(30);
/// The policy for traffic from inside the cluster (see the module doc).
pub const INTERNAL_TRAFFIC_POLICY: &str = "Local";

/// The ports of the Service and the slice: name, port, protocol (kubeadm's kube-dns).
fn ports() -> [(&'static str, u16, &'static str); 3] {
    [
        ("dns", DNS_PORT, "UDP"),
        ("dns-tcp", DNS_PORT, "TCP"),
        ("metrics", METRICS_PORT, "TCP"),
    ]
}

/// The Service as it should be.
pub fn desired_service(dns_ip: IpAddr) -> Service {
    let family = if dns_ip.is_ipv4() { "IPv4" } else { "IPv6" };
    Service {
        metadata: ObjectMeta {
            name: Some(SERVICE_NAME.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            labels: Some(BTreeMap::from([
                (APP_LABEL.0.to_string(), APP_LABEL.1.to_string()),
                ("kubernetes.io/name".to_string(), "CoreDNS".to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            cluster_ip: Some(dns_ip.to_string()),
            cluster_ips: Some(vec![dns_ip.to_string()]),
            ip_families: Some(vec![family.to_string()]),
            internal_traffic_policy: Some(INTERNAL_TRAFFIC_POLICY.to_string()),
            ports: Some(
                ports()
                    .into_iter()
                    .map(|(name, port, proto)| ServicePort {
                        name: Some(name.to_string()),
                        port: i32::from(port),
                        protocol: Some(proto.to_string()),
                        target_port: Some(IntOrString::Int(i32::from(port))),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// A node's InternalIP of `family` if it is Ready.
fn ready_internal_ip(node: &Node, v4: bool) -> Option<IpAddr> {
    let status = node.status.as_ref()?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    status
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4() == v4)
}

/// The slice as it should be for `nodes`, owned by the Service `owner_uid` if known.
pub fn desired_slice(
    dns_ip: IpAddr,
    nodes: &[Arc<Node>],
    owner_uid: Option<&str>,
) -> EndpointSlice {
    let v4 = dns_ip.is_ipv4();
    let mut endpoints: Vec<Endpoint> = nodes
        .iter()
        .filter_map(|n| {
            let ip = ready_internal_ip(n, v4)?;
            Some(Endpoint {
                addresses: vec![ip.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                node_name: n.metadata.name.clone(),
                ..Endpoint::default()
            })
        })
        .collect();
    endpoints.sort_by(|a, b| a.node_name.cmp(&b.node_name));
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(SLICE_NAME.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            labels: Some(BTreeMap::from([
                (SERVICE_NAME_LABEL.to_string(), SERVICE_NAME.to_string()),
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                (APP_LABEL.0.to_string(), APP_LABEL.1.to_string()),
            ])),
            owner_references: owner_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".to_string(),
                    kind: "Service".to_string(),
                    name: SERVICE_NAME.to_string(),
                    uid: uid.to_string(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..ObjectMeta::default()
        },
        address_type: if v4 { "IPv4" } else { "IPv6" }.to_string(),
        endpoints,
        ports: Some(
            ports()
                .into_iter()
                .map(|(name, port, proto)| EndpointPort {
                    name: Some(name.to_string()),
                    port: Some(i32::from(port)),
                    protocol: Some(proto.to_string()),
                    app_protocol: None,
                })
                .collect(),
        ),
    }
}

/// Makes the Service what it should be; returns its UID. Only the fields this controller
/// owns are compared and written: labels it sets, ports, the traffic policy.
async fn ensure_service(api: &Api<Service>, dns_ip: IpAddr) -> anyhow::Result<Option<String>> {
    let desired = desired_service(dns_ip);
    let Some(mut current) = api.get_opt(SERVICE_NAME).await? else {
        let created = api.create(&PostParams::default(), &desired).await?;
        info!(ip = %dns_ip, "cluster DNS: created the kube-dns Service");
        return Ok(created.metadata.uid);
    };
    let want = desired.spec.clone().unwrap_or_default();
    let mut spec = current.spec.clone().unwrap_or_default();
    if spec.cluster_ip.as_deref() != want.cluster_ip.as_deref() {
        // The cluster IP is immutable: a Service that holds another one is the operator's to
        // delete; pods would be sent to the wrong address meanwhile, so say so loudly.
        error!(
            have = ?spec.cluster_ip,
            want = %dns_ip,
            "cluster DNS: kube-system/kube-dns has another cluster IP than the kubelet's --cluster-dns; delete it to let skerry recreate it"
        );
    }
    let mut labels = current.metadata.labels.clone().unwrap_or_default();
    let mut changed = false;
    for (k, v) in desired.metadata.labels.clone().unwrap_or_default() {
        if labels.get(&k) != Some(&v) {
            labels.insert(k, v);
            changed = true;
        }
    }
    if spec.ports != want.ports
        || spec.internal_traffic_policy != want.internal_traffic_policy
        || spec.selector.as_ref().is_some_and(|s| !s.is_empty())
    {
        spec.ports = want.ports;
        spec.internal_traffic_policy = want.internal_traffic_policy;
        spec.selector = None;
        changed = true;
    }
    if changed {
        current.metadata.labels = Some(labels);
        current.spec = Some(spec);
        api.replace(SERVICE_NAME, &PostParams::default(), &current)
            .await?;
        info!("cluster DNS: reverted the kube-dns Service to its ports and labels");
    }
    Ok(current.metadata.uid)
}

/// Makes the slice what it should be for the nodes in `nodes`.
async fn ensure_slice(
    api: &Api<EndpointSlice>,
    dns_ip: IpAddr,
    nodes: &Indexer<Node>,
    owner_uid: Option<&str>,
) -> anyhow::Result<()> {
    let mut all = nodes.list();
    all.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let desired = desired_slice(dns_ip, &all, owner_uid);
    let Some(mut current) = api.get_opt(SLICE_NAME).await? else {
        api.create(&PostParams::default(), &desired).await?;
        info!(
            endpoints = desired.endpoints.len(),
            "cluster DNS: created the kube-dns EndpointSlice"
        );
        return Ok(());
    };
    let same = current.endpoints == desired.endpoints
        && current.ports == desired.ports
        && current.address_type == desired.address_type
        && current.metadata.labels == desired.metadata.labels
        && (owner_uid.is_none()
            || current.metadata.owner_references == desired.metadata.owner_references);
    if same {
        return Ok(());
    }
    if current.address_type != desired.address_type {
        // addressType is immutable: replace the slice.
        api.delete(SLICE_NAME, &skerry_client::DeleteParams::default())
            .await?;
        api.create(&PostParams::default(), &desired).await?;
        return Ok(());
    }
    current.endpoints = desired.endpoints;
    current.ports = desired.ports;
    current.metadata.labels = desired.metadata.labels;
    if owner_uid.is_some() {
        current.metadata.owner_references = desired.metadata.owner_references;
    }
    api.replace(SLICE_NAME, &PostParams::default(), &current)
        .await?;
    info!(
        endpoints = current.endpoints.len(),
        "cluster DNS: updated the kube-dns EndpointSlice"
    );
    Ok(())
}

/// Wakes the reconcile loop on any Node event.
struct Wake(Arc<Notify>);

impl EventHandler<Node> for Wake {
    fn on_add(&self, _: &Arc<Node>, _: bool) {
        self.0.notify_one();
    }
    fn on_update(&self, _: &Arc<Node>, _: &Arc<Node>) {
        self.0.notify_one();
    }
    fn on_delete(&self, _: &Deleted<Node>) {
        self.0.notify_one();
    }
}

/// The leader's work: reconcile on Node events and every [`RESYNC`] until `stop`.
async fn lead(client: Client, dns_ip: IpAddr, stop: CancellationToken) {
    let nodes = SharedInformer::new(client.api::<Node>(None), None);
    let wake = Arc::new(Notify::new());
    nodes.add_handler(Wake(wake.clone()));
    nodes.run(stop.clone());
    if !nodes.wait_for_sync(&stop).await {
        return;
    }
    let services = client.api::<Service>(Some(NAMESPACE));
    let slices = client.api::<EndpointSlice>(Some(NAMESPACE));
    loop {
        let result = async {
            let uid = ensure_service(&services, dns_ip).await?;
            ensure_slice(&slices, dns_ip, &nodes.store(), uid.as_deref()).await
        }
        .await;
        let wait = match result {
            Ok(()) => RESYNC,
            Err(e) => {
                warn!(error = %e, "cluster DNS: reconciling kube-dns failed; retrying");
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Keeps the kube-dns Service and EndpointSlice in step with the Nodes while this member
/// leads (a Lease `kube-system/skerry-kube-dns`, as `config.identity`), until `stop`.
pub async fn run_service_controller(client: Client, config: DnsConfig, stop: CancellationToken) {
    run_service_controller_with(
        client,
        LeaderElectionConfig::new(NAMESPACE, LEASE_NAME, &config.identity),
        config.cluster_dns_ip,
        stop,
    )
    .await;
}

/// [`run_service_controller`] with an explicit election (tests shorten its timeouts).
pub async fn run_service_controller_with(
    client: Client,
    mut election: LeaderElectionConfig,
    dns_ip: IpAddr,
    stop: CancellationToken,
) {
    election.release_on_cancel = true;
    let retry = election.retry_period;
    let lead_client = client.clone();
    let callbacks = Callbacks::new(move |token| lead(lead_client.clone(), dns_ip, token));
    let elector = match LeaderElector::for_client(&client, election, callbacks) {
        Ok(e) => e,
        Err(e) => {
            error!(error = %e, "cluster DNS: bad leader-election configuration");
            return;
        }
    };
    loop {
        let outcome = elector.run(&stop).await;
        info!(?outcome, "cluster DNS: kube-dns controller term ended");
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(retry) => {}
        }
    }
}
