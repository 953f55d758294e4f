//! Wiring of the node agent into `skerry server`: every member is also a node, as k3s's
//! server is. With no flags, skerry starts its own supervised containerd under the data dir,
//! imports the pause image it builds from catatonit, watches the images folder, and runs the
//! kubelet (`skerry_node::kubelet`) as `system:node:<name>` in `system:nodes`, with a client
//! certificate the cluster CA issues in memory; what it may do is the apiserver's Node
//! authorizer's and NodeRestriction's to decide, with no RBAC binding of its own
//! (`server/apiserver/src/node_authz.rs`). `--container-runtime-endpoint` names any CRI
//! runtime instead.
//!
//! A machine that cannot run containers (no containerd or runc, not root) still serves the
//! control plane: one line says what to install, and the node agent stays off.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use k8s_openapi::api::core::v1::Taint;
use skerry_client::Client;
use skerry_node::cni::{self, CniConfig};
use skerry_node::containerd::config::cni_bin_dir;
use skerry_node::containerd::{Containerd, ContainerdConfig};
use skerry_node::cri::Cri;
use skerry_node::images::{self, build};
use skerry_node::kubelet::{Kubelet, KubeletConfig};
use skerry_node::machine::{self, Reservations};
use skerry_node::nodestatus::address;
use skerry_node::nodestatus::readiness::Readiness;
use skerry_node::nodestatus::{NodeStatusConfig, NodeStatusManager, RuntimeInfo, flags};
use skerry_node::server::KubeletServer;
use skerry_node::server::auth::Auth;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::pki::{LEAF_VALIDITY, Pki};

/// The node agent's flags (the kubelet's names).
#[derive(Args, Clone, Debug)]
pub struct NodeArgs {
    /// Run no node agent on this member: the control plane only (k3s's flag).
    #[arg(long)]
    pub disable_agent: bool,
    /// A CRI runtime's socket (unix:///path or a path) to use instead of starting skerry's
    /// own containerd.
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// The image of every pod's sandbox (its "pause" container); skerry builds and imports
    /// skerry.local/pause:1 itself.
    #[arg(long, default_value = build::PAUSE_IMAGE)]
    pub pod_infra_container_image: String,
    /// The node's IP address [default: the address of the default route's interface].
    #[arg(long)]
    pub node_ip: Option<IpAddr>,
    /// The node's name [default: the host name].
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// The kubelet's directory (pods' volumes and logs) [default: <data-dir>/agent/kubelet].
    #[arg(long)]
    pub root_dir: Option<PathBuf>,
    /// DNS servers of pods with dnsPolicy ClusterFirst, comma-separated [default: none: such
    /// pods get the node's resolver configuration].
    #[arg(long, value_delimiter = ',')]
    pub cluster_dns: Vec<IpAddr>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Most pods this node runs (the kubelet's default).
    #[arg(long, default_value_t = 110)]
    pub max_pods: u32,
    /// The cgroup under which the pods' `kubepods` hierarchy goes (the kubelet's flag).
    #[arg(long, default_value = "/")]
    pub cgroup_root: String,
    /// Labels of the Node at registration, `key=value,...` (the kubelet's rules for the
    /// kubernetes.io and k8s.io prefixes).
    #[arg(long, value_parser = parse_node_labels, default_value = "")]
    pub node_labels: BTreeMap<String, String>,
    /// Taints of the Node at registration, `key=value:Effect,...`.
    #[arg(long, value_parser = parse_taints, default_value = "")]
    pub register_with_taints: Taints,
    /// What is kept for the kubelet and the runtime, `cpu=100m,memory=256Mi,...`.
    #[arg(long, default_value = "")]
    pub kube_reserved: String,
    /// What is kept for the system's own daemons, `cpu=100m,memory=256Mi,...`.
    #[arg(long, default_value = "")]
    pub system_reserved: String,
    /// The hard eviction thresholds, subtracted from allocatable (the kubelet's default).
    #[arg(long, default_value = machine::EVICTION_HARD_DEFAULT)]
    pub eviction_hard: String,
    /// Requests a second the kubelet sends to the apiserver (the kubelet's `kubeAPIQPS`; 0:
    /// no limit).
    #[arg(long, default_value_t = KUBE_API_QPS, value_parser = parse_qps)]
    pub kube_api_qps: f64,
    /// Requests the kubelet may send at once before the QPS applies (`kubeAPIBurst`).
    #[arg(long, default_value_t = KUBE_API_BURST)]
    pub kube_api_burst: u32,
    /// The port of the kubelet's HTTPS API (logs for `kubectl logs`); 0 serves none.
    #[arg(long, default_value_t = skerry_node::server::DEFAULT_PORT)]
    pub kubelet_port: u16,
}

/// The kubelet's own client limits, not client-go's 5/10: every pod start writes its status
/// and several events, so 30 pods starting at once would queue ~6 s behind a QPS of 5 (seen
/// in the pod start-up benchmark). Upstream raised the kubelet's defaults to 50/100 in 1.27
/// (`KubeletConfiguration` `kubeAPIQPS`, `kubeAPIBurst`, kubernetes/kubernetes#116121).
const KUBE_API_QPS: f64 = 50.0;
/// See [`KUBE_API_QPS`].
const KUBE_API_BURST: u32 = 100;

/// `--register-with-taints`, parsed.
#[derive(Clone, Debug, Default)]
pub struct Taints(pub Vec<Taint>);

/// `--kube-api-qps`: a finite number, not negative (the kubelet's `ValidateKubeletConfiguration`).
fn parse_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(qps) if qps.is_finite() && qps >= 0.0 => Ok(qps),
        Ok(qps) if qps.is_finite() => Err("must not be a negative number".to_string()),
        Ok(_) => Err("must be a finite number".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_node_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    flags::parse_node_labels(text).map_err(|e| e.0)
}

fn parse_taints(text: &str) -> Result<Taints, String> {
    flags::parse_taints(text).map(Taints).map_err(|e| e.0)
}

impl NodeArgs {
    /// The reservations of `--kube-reserved`, `--system-reserved` and `--eviction-hard`; an
    /// error names its flag.
    pub fn reservations(&self) -> Result<Reservations, String> {
        Reservations::parse(
            &self.kube_reserved,
            &self.system_reserved,
            &self.eviction_hard,
        )
        .map_err(|e| e.0)
    }
}

/// The kubelet's own directory under the agent's.
const KUBELET_DIR: &str = "agent/kubelet";
/// The cgroup of every pod, under `--cgroup-root` (the kubelet's `defaultNodeAllocatableCgroupName`).
const KUBEPODS: &str = "kubepods";
/// The pause image's source binary.
const CATATONIT: &str = build::CATATONIT;

/// The node agent, running.
pub struct NodeAgent {
    task: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
    containerd: Option<Containerd>,
}

impl NodeAgent {
    /// Stops the kubelet, then the supervised containerd (containers keep running, as when
    /// the upstream kubelet and containerd stop).
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        if let Some(containerd) = self.containerd {
            containerd.stop().await;
        }
    }
}

/// Starts the node agent, or says in one line why it cannot run and returns `None`.
pub async fn start(
    args: &NodeArgs,
    data_dir: &Path,
    pki: Arc<Pki>,
    api_url: &str,
    mut stop_rx: watch::Receiver<bool>,
) -> Option<NodeAgent> {
    if args.disable_agent {
        return None;
    }
    let (cri, containerd) = match &args.container_runtime_endpoint {
        Some(endpoint) => match Cri::new(endpoint) {
            Ok(cri) => (cri, None),
            Err(e) => {
                eprintln!("skerry: no node agent: --container-runtime-endpoint: {e}");
                return None;
            }
        },
        None => {
            if !rustix::process::geteuid().is_root() {
                eprintln!(
                    "skerry: no node agent: running containers needs root (the control plane serves; start as root to run pods)"
                );
                return None;
            }
            match Containerd::start(ContainerdConfig {
                data_dir: data_dir.to_path_buf(),
                sandbox_image: args.pod_infra_container_image.clone(),
                binary: None,
            })
            .await
            {
                Ok(c) => (c.cri().clone(), Some(c)),
                Err(e) => {
                    eprintln!("skerry: no node agent: {e}");
                    return None;
                }
            }
        }
    };
    let stop = CancellationToken::new();
    if let Some(c) = &containerd {
        let api = images::k8s_api(&c.layout().socket);
        let spool = c.layout().images_dir.clone();
        if args.pod_infra_container_image == build::PAUSE_IMAGE {
            match images::import_pause_image(&api, Path::new(CATATONIT), &spool).await {
                Ok(_) => info!(image = build::PAUSE_IMAGE, "pause image imported"),
                Err(e) => eprintln!(
                    "skerry: the pause image cannot be built ({e}): install the Debian package catatonit"
                ),
            }
        }
        let (folder_stop_tx, folder_stop) = watch::channel(false);
        let token = stop.clone();
        tokio::spawn(async move {
            token.cancelled().await;
            let _ = folder_stop_tx.send(true);
        });
        tokio::spawn(images::watch::watch_folder(api, spool, folder_stop, None));
    }

    let node_name = match address::hostname(args.hostname_override.as_deref()) {
        Ok(name) => name,
        Err(e) => {
            eprintln!("skerry: no node agent: {e}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };
    let root_dir = args
        .root_dir
        .clone()
        .unwrap_or_else(|| data_dir.join(KUBELET_DIR));
    let client = match node_client(&pki, api_url, &node_name, args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skerry: no node agent: {e:#}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };

    // The Node in the API: registration, status and Lease (`skerry_node::nodestatus`), and
    // the pod network written from the podCIDR the IPAM controller gives the node, into
    // the conf dir the runtime reads.
    if let Err(e) = std::fs::create_dir_all(&root_dir) {
        eprintln!(
            "skerry: no node agent: cannot create --root-dir {}: {e}",
            root_dir.display()
        );
        if let Some(c) = containerd {
            c.stop().await;
        }
        return None;
    }
    // The address the Node publishes (the status loop computes it the same way), for the
    // pods' hostIP and the kubelet's serving certificate; loopback when there is none, which
    // the Node's status then reports as an error.
    let node_ip = address::internal_ip(&node_name, args.node_ip, &node_name, Path::new("/proc"))
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no node address; pods get the loopback as hostIP");
            IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        });
    // The kubelet's API: bound now, so the Node publishes the port actually served.
    let kubelet_api = match kubelet_listener(args.kubelet_port, &pki, &node_name, node_ip).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skerry: no node agent: the kubelet's API: {e:#}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };
    let mut status_config = NodeStatusConfig::new(&node_name, root_dir.clone());
    status_config.kubelet_port = kubelet_api.as_ref().map_or(0, |(l, _)| {
        l.local_addr().map_or(0, |a| i32::from(a.port()))
    });
    status_config.node_ip = args.node_ip;
    status_config.max_pods = args.max_pods;
    status_config.node_labels = args.node_labels.clone();
    status_config.register_with_taints = args.register_with_taints.0.clone();
    status_config.reservations = match args.reservations() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skerry: no node agent: {e}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };
    let readiness = Readiness::new();
    let mut cni_config = CniConfig::under(&root_dir);
    cni_config.plugin_dir = cni_bin_dir();
    if let Some(c) = &containerd {
        cni_config.conf_dir = c.layout().cni_conf_dir.clone();
    }
    let runtime: Arc<dyn RuntimeInfo> = Arc::new(cri.clone());
    let status =
        match NodeStatusManager::new(client.clone(), status_config, runtime, readiness.clone()) {
            Ok(m) => Arc::new(
                m.with_pod_cidr_handler(cni::pod_cidr_handler(cni_config, readiness.clone())),
            ),
            Err(e) => {
                eprintln!("skerry: no node agent: reading the machine: {e}");
                if let Some(c) = containerd {
                    c.stop().await;
                }
                return None;
            }
        };
    readiness.set_runtime_up();

    let memory = status
        .capacity()
        .get("memory")
        .map_or(0, |q| q.0 / 1_000_000_000);
    let config = KubeletConfig {
        node_name: node_name.clone(),
        root_dir,
        node_ips: vec![node_ip.to_string()],
        cluster_dns: args.cluster_dns.iter().map(IpAddr::to_string).collect(),
        cluster_domain: args.cluster_domain.clone(),
        cgroup_root: format!("{}/{KUBEPODS}", args.cgroup_root.trim_end_matches('/')),
        memory_capacity: i64::try_from(memory).unwrap_or(i64::MAX),
        allocatable: machine::to_api(status.allocatable()),
        resolv_conf: PathBuf::from("/etc/resolv.conf"),
        hosts_file: PathBuf::from("/etc/hosts"),
    };
    let token = stop.clone();
    tokio::spawn(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
        token.cancel();
    });
    let kubelet = Kubelet::new(config, cri, client.clone(), stop.clone());
    if let Some((listener, tls)) = kubelet_api {
        let server = KubeletServer::new(kubelet.clone(), Auth::new(&client));
        tokio::spawn(server.serve(listener, tls, stop.clone()));
    }
    let task_stop = stop.clone();
    let task = tokio::spawn(async move {
        // No binding to wait for: the apiserver's Node authorizer grants the node what it
        // needs (its pods' secrets, configmaps and tokens, its Node and Lease), and
        // NodeRestriction narrows its writes to its own.
        tokio::spawn(status.run(task_stop.clone()));
        info!(node = %node_name, ip = %node_ip, "node agent running");
        kubelet.run().await;
    });
    Some(NodeAgent {
        task,
        stop,
        containerd,
    })
}

/// The kubelet API's listener on `port` (all addresses, as the kubelet's `--address`
/// 0.0.0.0) and its TLS: the node's serving certificate from the cluster CA for its name,
/// its IP and the loopbacks, client certificates asked for and verified against the CA (a
/// caller without one may still present a bearer token). `None` for port 0.
async fn kubelet_listener(
    port: u16,
    pki: &Pki,
    node: &str,
    node_ip: IpAddr,
) -> Result<
    Option<(
        tokio::net::TcpListener,
        Arc<tokio_rustls::rustls::ServerConfig>,
    )>,
> {
    if port == 0 {
        return Ok(None);
    }
    let mut ips = vec![node_ip];
    ips.extend(crate::pki::SERVING_IPS.iter().filter(|ip| **ip != node_ip));
    let cert = pki
        .issue_node_serving_cert(node, &ips)
        .context("issue the kubelet's serving certificate")?;
    let roots = skerry_tls::config::roots([pki.ca_cert_der().clone()])?;
    let tls = skerry_tls::config::server_config(
        cert.cert_chain()?,
        cert.private_key()?,
        skerry_tls::config::ClientAuth::Optional(Arc::new(roots)),
        &[b"http/1.1"],
    )?;
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port))
        .await
        .with_context(|| format!("--kubelet-port {port}: bind"))?;
    Ok(Some((listener, Arc::new(tls))))
}

/// The kubelet's client: `system:node:<name>` in `system:nodes`.
fn node_client(pki: &Pki, url: &str, node: &str, args: &NodeArgs) -> Result<Client> {
    let user = format!("system:node:{node}");
    let cert = pki
        .issue_client_cert(&user, &["system:nodes"], LEAF_VALIDITY)
        .with_context(|| format!("issue a client certificate for {user}"))?;
    let mut config = client_config(pki, url, &user, cert.cert_pem, cert.key_pem);
    config.qps = args.kube_api_qps;
    config.burst = args.kube_api_burst;
    Ok(Client::new(config)?)
}

fn client_config(
    pki: &Pki,
    url: &str,
    user: &str,
    cert_pem: String,
    key_pem: String,
) -> skerry_client::Config {
    let mut config = skerry_client::Config::new(url);
    config.ca_pem = Some(pki.ca_cert_pem().to_string());
    config.credentials = skerry_client::Credentials::ClientCert { cert_pem, key_pem };
    config.user_agent = format!("skerry/{user}");
    config
}
