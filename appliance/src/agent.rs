//! `skerry agent`: the node agent alone (containerd, the kubelet, its API) joined to a cluster
//! that runs elsewhere, as k3s's agent is, and `skerry node-credentials`, which a member uses
//! to issue what an agent needs. For now the credentials are files given by flags, named as the
//! upstream kubelet's (`--kubeconfig`, `--tls-cert-file`, `--tls-private-key-file`,
//! `--client-ca-file`); joining with a token comes later.
//!
//! The agent's Node identity is the kubeconfig's client certificate (`system:node:<name>` in
//! `system:nodes`, authorized by the apiserver's Node authorizer, not by a binding an admin
//! writes), and its serving certificate is issued by the cluster CA, because the apiserver
//! verifies kubelets' certificates against that CA before it proxies logs or exec to them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use tracing::info;

use crate::kubeconfig::Kubeconfig;
use crate::node::{self, AgentCredentials, Identity, NodeArgs};
use skerry_apiserver::auth::bootstrap::KUBE_PROXY_USER;

/// The agent's data dir under `$HOME` when none is given: beside the server's default, not in
/// it, so a box can run both while trying things out.
const AGENT_DATA_DIR_DEFAULT: &str = ".skerry/agent";

/// The files `skerry node-credentials` writes into `--out`.
pub const KUBECONFIG_FILE: &str = "kubelet.kubeconfig";
/// See [`KUBECONFIG_FILE`].
pub const CERT_FILE: &str = "kubelet.crt";
/// See [`KUBECONFIG_FILE`].
pub const KEY_FILE: &str = "kubelet.key";
/// The node network's kubeconfig (`system:kube-proxy`), also written into `--out`.
pub const NETWORK_KUBECONFIG_FILE: &str = "network.kubeconfig";

#[derive(Parser)]
pub struct AgentArgs {
    /// The cluster's Kubernetes API (https://HOST:PORT of any member).
    #[arg(long)]
    pub server: String,
    /// The node's kubeconfig: the cluster CA and the node's client certificate
    /// (`skerry node-credentials` writes one).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The kubelet API's serving certificate, issued by the cluster CA.
    #[arg(long)]
    pub tls_cert_file: PathBuf,
    /// The key of --tls-cert-file.
    #[arg(long)]
    pub tls_private_key_file: PathBuf,
    /// The CA of the client certificates the kubelet's API accepts [default: the kubeconfig's
    /// certificate authority, the cluster CA].
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// The node network's kubeconfig: the cluster CA and kube-proxy's client certificate
    /// (`system:kube-proxy`, which reads every Service, EndpointSlice and Node; `skerry
    /// node-credentials` writes one). Needed unless --disable-network.
    #[arg(long)]
    pub network_kubeconfig: Option<PathBuf>,
    /// The agent's data dir (containerd, the kubelet's files) [default: ~/.skerry/agent].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Log level filter (tracing's syntax; RUST_LOG overrides).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    #[command(flatten)]
    pub node: NodeArgs,
}

#[derive(Parser)]
pub struct NodeCredentialsArgs {
    /// The node's name (the agent's --hostname-override, or its hostname).
    #[arg(long)]
    pub node: String,
    /// The node's addresses for its serving certificate, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ip: Vec<IpAddr>,
    /// The API's URL written into the kubeconfig.
    #[arg(long, default_value = "https://127.0.0.1:6443")]
    pub server: String,
    /// The server's data directory [default: ~/.skerry/store]; its PKI is <data-dir>/pki.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The PKI directory, when the server was started with --pki-dir.
    #[arg(long)]
    pub pki_dir: Option<PathBuf>,
    /// How long the certificates are valid (e.g. 8760h).
    #[arg(long, default_value = "8760h", value_parser = crate::parse_duration)]
    pub valid_for: Duration,
    /// The directory to write kubelet.kubeconfig, kubelet.crt and kubelet.key into.
    #[arg(long)]
    pub out: PathBuf,
}

/// `skerry node-credentials`: the node's client certificate in a kubeconfig and its serving
/// certificate, from the cluster CA, into `--out` (keys mode 0600).
pub fn node_credentials(args: NodeCredentialsArgs) -> Result<()> {
    // The name as the agent will compute it from its --hostname-override (lower case).
    let node = skerry_node::nodestatus::address::hostname(Some(&args.node))
        .map_err(|e| anyhow::anyhow!("--node {:?}: {e}", args.node))?;
    let pki = crate::kube::load_pki(args.data_dir.as_deref(), args.pki_dir.as_deref())?;
    let user = format!("system:node:{node}");
    let client = pki
        .issue_client_cert(&user, &["system:nodes"], args.valid_for)
        .with_context(|| format!("issue a client certificate for {user}"))?;
    let serving = pki
        .issue_node_serving_cert(&node, &args.ip)
        .context("issue the kubelet's serving certificate")?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("--out {}", args.out.display()))?;
    Kubeconfig {
        server_url: &args.server,
        ca_cert_pem: pki.ca_cert_pem(),
        user: &user,
        client_cert_pem: &client.cert_pem,
        client_key_pem: &client.key_pem,
    }
    .write(&args.out.join(KUBECONFIG_FILE))?;
    let network = pki
        .issue_client_cert(KUBE_PROXY_USER, &[], args.valid_for)
        .with_context(|| format!("issue a client certificate for {KUBE_PROXY_USER}"))?;
    Kubeconfig {
        server_url: &args.server,
        ca_cert_pem: pki.ca_cert_pem(),
        user: KUBE_PROXY_USER,
        client_cert_pem: &network.cert_pem,
        client_key_pem: &network.key_pem,
    }
    .write(&args.out.join(NETWORK_KUBECONFIG_FILE))?;
    serving
        .write(&args.out.join(CERT_FILE), &args.out.join(KEY_FILE))
        .context("write the serving certificate")?;
    println!(
        "skerry: credentials of node {} in {}: skerry agent --server {} --hostname-override {} --kubeconfig {} --network-kubeconfig {} --tls-cert-file {} --tls-private-key-file {}",
        node,
        args.out.display(),
        args.server,
        node,
        args.out.join(KUBECONFIG_FILE).display(),
        args.out.join(NETWORK_KUBECONFIG_FILE).display(),
        args.out.join(CERT_FILE).display(),
        args.out.join(KEY_FILE).display(),
    );
    Ok(())
}

/// `skerry agent`: runs the node agent until SIGTERM or Ctrl-C, then stops the kubelet and
/// its containerd (the pods' containers keep running, as with the upstream kubelet).
pub fn agent(mut args: AgentArgs) -> Result<()> {
    if args.node.disable_agent {
        bail!(
            "--disable-agent: `skerry agent` is the node agent; run `skerry server` for the control plane alone"
        );
    }
    if !args.server.starts_with("https://") {
        bail!(
            "--server {}: an https:// URL of the Kubernetes API",
            args.server
        );
    }
    args.node.validate().map_err(anyhow::Error::msg)?;
    // The cluster DNS of a server with the default Service range, unless named.
    if args.node.cluster_dns.is_empty() && !args.node.disable_network {
        args.node.cluster_dns = vec![skerry_net::dns::DEFAULT_CLUSTER_DNS_IP];
    }
    if !args.node.disable_network && args.network_kubeconfig.is_none() {
        bail!(
            "the node's network needs --network-kubeconfig (skerry node-credentials writes {NETWORK_KUBECONFIG_FILE}), or give --disable-network"
        );
    }
    let mut credentials = AgentCredentials::read(
        &args.server,
        &args.kubeconfig,
        &args.tls_cert_file,
        &args.tls_private_key_file,
        args.client_ca_file.as_deref(),
    )?;
    if let Some(path) = args
        .network_kubeconfig
        .as_ref()
        .filter(|_| !args.node.disable_network)
    {
        let mut network = skerry_client::Config::from_kubeconfig(path)
            .with_context(|| format!("--network-kubeconfig {}", path.display()))?;
        network.server = args.server.clone();
        credentials.network = Some(network);
    }
    let data_dir = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => {
            let home =
                std::env::var_os("HOME").context("no --data-dir given and $HOME is not set")?;
            PathBuf::from(home).join(AGENT_DATA_DIR_DEFAULT)
        }
    };
    create_data_dir(&data_dir)?;
    crate::init_logging(&args.log_level)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let Some(agent) = node::start(
            &args.node,
            &data_dir,
            Identity::Files(Box::new(credentials)),
            &args.server,
            stop_rx,
        )
        .await
        else {
            bail!("the node agent did not start (the line above says why)");
        };
        println!(
            "skerry: node agent joined {} (data dir {})",
            args.server,
            data_dir.display()
        );
        crate::shutdown_signal().await;
        info!("stopping the node agent");
        let _ = stop_tx.send(true);
        agent.stop().await;
        Ok(())
    })
}

fn create_data_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("--data-dir {}", dir.display()))
}
