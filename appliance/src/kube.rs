//! Wiring of the Kubernetes API into `skerry server`: the PKI, the TLS configuration, the
//! authenticators, the apiserver itself and the admin kubeconfig.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use skerry_apiserver::auth::serviceaccount::{ISSUER_DEFAULT, TokenIssuer};
use skerry_apiserver::auth::token::TokenFile;
use skerry_apiserver::auth::{Authenticator, x509};
use skerry_apiserver::handler::Config;
use skerry_apiserver::ipalloc::ServiceCidr;
use skerry_apiserver::{ApiServer, compactor};
use skerry_store::Store;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::kubeconfig::Kubeconfig;
use crate::pki::{ADMIN_USER, CA_CERT_FILE, PKI_DIR, Pki};
use crate::{ADMIN_KUBECONFIG_FILE, DATA_DIR_DEFAULT, KubeconfigArgs, ServerArgs};

/// Pause between attempts to seed a cluster's store while it has no quorum yet.
const START_RETRY: Duration = Duration::from_secs(1);

/// The running apiserver, and what the node agent needs to reach it.
pub struct Started {
    /// The apiserver and its controllers.
    pub task: tokio::task::JoinHandle<()>,
    /// The cluster PKI (the node's client certificate comes from its CA).
    pub pki: Arc<Pki>,
    /// The API's URL on the loopback.
    pub local_url: String,
}

/// Loads (or creates) the PKI, writes the admin kubeconfig, and spawns the apiserver, which
/// starts serving once the store accepts writes (a cluster needs its quorum first).
pub fn start(
    args: &ServerArgs,
    data_dir: &Path,
    store: Store,
    listener: TcpListener,
    stop: watch::Receiver<bool>,
) -> Result<Started> {
    let pki_dir = args
        .pki_dir
        .clone()
        .unwrap_or_else(|| data_dir.join(PKI_DIR));
    let mut names = args.tls_san.clone();
    if !args.bind_address.is_unspecified() {
        names.push(args.bind_address.to_string());
    }
    let pki = Pki::load_or_create(&pki_dir, &names).context("load the PKI")?;
    let chain = pki
        .serving()
        .cert_chain()
        .context("read the serving certificate")?;
    let key = pki
        .serving()
        .private_key()
        .context("read the serving key")?;
    let tls = x509::server_tls_config(pki.ca_cert_der().clone(), chain, key)
        .context("configure TLS for the Kubernetes API")?;
    let issuer = TokenIssuer::new(
        &pki.service_account_key_pkcs8(),
        ISSUER_DEFAULT,
        vec![ISSUER_DEFAULT.to_string()],
    )
    .context("load the service-account signing key")?;
    let token_file = match &args.token_auth_file {
        Some(path) => Some(
            TokenFile::load(path)
                .with_context(|| format!("--token-auth-file {}", path.display()))?,
        ),
        None => None,
    };
    let port = listener
        .local_addr()
        .context("API listener address")?
        .port();
    let service_cidr = ServiceCidr::parse(&args.service_cluster_ip_range)
        .map_err(|e| anyhow::anyhow!("--service-cluster-ip-range: {e}"))?;
    let node_port_range =
        skerry_apiserver::portalloc::PortRange::parse(&args.service_node_port_range)
            .map_err(|e| anyhow::anyhow!("--service-node-port-range: {e}"))?;
    let controllers_config = skerry_controllers::manager::ManagerConfig {
        node_ipam: skerry_controllers::nodeipam::NodeIpamConfig::parse(
            args.allocate_node_cidrs,
            &args.node.cluster_cidr,
            args.node_cidr_mask_size,
            Some(&args.service_cluster_ip_range),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?,
        root_ca_pem: pki.ca_cert_pem().to_string(),
    };
    let host = match args.bind_address {
        a if a.is_unspecified() => "127.0.0.1".to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
        a => a.to_string(),
    };
    let url = format!("https://{host}:{port}");
    let kubeconfig = data_dir.join(ADMIN_KUBECONFIG_FILE);
    crate::kubeconfig::write_admin_kubeconfig(&kubeconfig, &url, &pki)
        .context("write the admin kubeconfig")?;
    println!(
        "skerry: serving the Kubernetes API on {url}; admin kubeconfig: {} (PKI in {})",
        kubeconfig.display(),
        pki.dir().display()
    );
    let server_address = format!("{host}:{port}");
    let verifier = issuer.verifier(vec![ISSUER_DEFAULT.to_string()]);
    let config = Config {
        server_address,
        authenticator: Authenticator {
            token_file,
            service_accounts: Some(verifier),
        },
        token_issuer: Some(issuer),
        compaction_interval: Some(compactor::COMPACTION_INTERVAL),
        service_cidr,
        node_port_range,
        // The controllers' workqueues (kube-controller-manager serves these on its own port).
        extra_metrics: Some(Arc::new(skerry_client::workqueue::metrics::encode_text)),
        kubelet_client: Some(kubelet_client(&pki)?),
        service_account_admission: true,
    };
    let pki = Arc::new(pki);
    // The controllers talk to this member's own apiserver on the loopback.
    let local_url = format!("https://127.0.0.1:{port}");
    let identity = format!("{}_{:016x}", args.name, rand_suffix());
    let scheduler_identity = format!("{}_{:016x}", args.name, rand_suffix());
    let scheduler_client = local_client(
        &pki,
        &local_url,
        SCHEDULER_USER,
        None,
        (SCHEDULER_QPS, SCHEDULER_BURST),
    )?;
    let manager_client = controller_client(
        &pki,
        &local_url,
        CONTROLLER_MANAGER_USER,
        CONTROLLER_MANAGER_GROUP,
    )?;
    // The network's control-plane half: the service load balancer, and where this member's
    // own network runs, the kube-dns Service and its EndpointSlice of the nodes serving DNS.
    let network_client = local_client(
        &pki,
        &local_url,
        NETWORK_CONTROLLERS_USER,
        Some(crate::pki::ADMIN_GROUP),
        (
            skerry_controllers::manager::CONTROLLER_QPS,
            skerry_controllers::manager::CONTROLLER_BURST,
        ),
    )?;
    let network_identity = format!("{}_{:016x}", args.name, rand_suffix());
    let dns = match (args.node.disable_network, args.node.cluster_dns.first()) {
        (false, Some(ip)) => {
            let mut dns = skerry_net::dns::DnsConfig::new(Vec::new(), &network_identity);
            dns.cluster_dns_ip = *ip;
            dns.cluster_domain = args.node.cluster_domain.clone();
            Some(dns)
        }
        _ => None,
    };
    let started_pki = pki.clone();
    let started_url = local_url.clone();
    let task = tokio::spawn(async move {
        // A new cluster's store is seeded once it takes writes (a cluster needs its quorum).
        while let Err(e) = skerry_apiserver::startup::bootstrap(&store, &service_cidr, port).await {
            tracing::info!(error = %e.message, "the Kubernetes API waits for the store");
            tokio::time::sleep(START_RETRY).await;
        }
        let api = ApiServer::start(store, config);
        tracing::info!(%url, "Kubernetes API ready");
        // The controllers stop first, while the API still serves, so the leader can hand its
        // Lease back; then the API stops.
        let controllers = CancellationToken::new();
        let manager = tokio::spawn(skerry_controllers::manager::run(
            manager_client,
            controller_clients(pki, local_url),
            identity,
            controllers_config,
            controllers.clone(),
        ));
        let scheduler = tokio::spawn(skerry_scheduler::scheduler::run_leader_elected(
            scheduler_client,
            scheduler_identity,
            controllers.clone(),
        ));
        let mut network = vec![tokio::spawn(skerry_net::servicelb::run(
            network_client.clone(),
            skerry_net::servicelb::Config::new(&network_identity),
            controllers.clone(),
        ))];
        if let Some(dns) = dns {
            network.push(tokio::spawn(skerry_net::dns::run_service_controller(
                network_client,
                dns,
                controllers.clone(),
            )));
        }
        let (serve_stop_tx, serve_stop) = watch::channel(false);
        let mut stop = stop;
        tokio::spawn(async move {
            let _ = stop.wait_for(|s| *s).await;
            controllers.cancel();
            let network = futures::future::join_all(network);
            let stopped = futures::future::join3(manager, scheduler, network);
            if tokio::time::timeout(CONTROLLERS_STOP_TIMEOUT, stopped)
                .await
                .is_err()
            {
                tracing::warn!("controllers and scheduler did not stop in time");
            }
            let _ = serve_stop_tx.send(true);
        });
        skerry_apiserver::server::serve(api, listener, Arc::new(tls), serve_stop).await;
    });
    Ok(Started {
        task,
        pki: started_pki,
        local_url: started_url,
    })
}

/// The controller manager's own user: it reads through the shared informers and holds the
/// Lease; the bootstrap RBAC policy binds it to `system:kube-controller-manager`.
const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";
/// The user of the network's control-plane controllers (the kube-dns Service, the service
/// load balancer), in `system:masters`: they write Services, their status and EndpointSlices
/// in any namespace, as k3s's embedded controllers do with its admin credentials.
const NETWORK_CONTROLLERS_USER: &str = "system:skerry-network";
/// The scheduler's user; the bootstrap RBAC policy binds it to `system:kube-scheduler`.
const SCHEDULER_USER: &str = "system:kube-scheduler";
/// kube-scheduler's `--kube-api-qps` default: binds and status writes, 50 a second...
const SCHEDULER_QPS: f64 = 50.0;
/// ... with `--kube-api-burst` 100.
const SCHEDULER_BURST: u32 = 100;
/// Kubernetes gives kube-controller-manager no group beyond `system:authenticated`.
const CONTROLLER_MANAGER_GROUP: Option<&str> = None;
/// The group of every service account, as a service-account token would carry it.
const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";
/// The namespace of the controllers' service accounts (`kube-system/<controller>`).
const CONTROLLER_NAMESPACE: &str = "kube-system";
/// How long a stopping member waits for its controllers to drain and release the Lease
/// before the API stops: the Lease's renew deadline (10 s) is the most a term can take to end.
const CONTROLLERS_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A controller's client of the local apiserver (see [`local_client`]), limited as
/// kube-controller-manager's.
fn controller_client(
    pki: &Pki,
    url: &str,
    user: &str,
    group: Option<&str>,
) -> Result<skerry_client::Client> {
    let rate = (
        skerry_controllers::manager::CONTROLLER_QPS,
        skerry_controllers::manager::CONTROLLER_BURST,
    );
    local_client(pki, url, user, group, rate)
}

/// A client of the local apiserver as `user`, with a client certificate the cluster CA signs
/// now, sending at most `rate` = (QPS, burst). The certificates live in memory only.
fn local_client(
    pki: &Pki,
    url: &str,
    user: &str,
    group: Option<&str>,
    rate: (f64, u32),
) -> Result<skerry_client::Client> {
    let groups: Vec<&str> = group.into_iter().collect();
    let cert = pki
        .issue_client_cert(user, &groups, crate::pki::LEAF_VALIDITY)
        .with_context(|| format!("issue a client certificate for {user}"))?;
    let mut config = skerry_client::Config::new(url);
    config.ca_pem = Some(pki.ca_cert_pem().to_string());
    config.credentials = skerry_client::Credentials::ClientCert {
        cert_pem: cert.cert_pem,
        key_pem: cert.key_pem,
    };
    (config.qps, config.burst) = rate;
    config.user_agent = format!("skerry/{user}");
    Ok(skerry_client::Client::new(config)?)
}

/// Each controller's own client: `system:serviceaccount:kube-system:<controller>`, the user
/// its bootstrap `system:controller:<controller>` role is bound to.
fn controller_clients(pki: Arc<Pki>, url: String) -> skerry_controllers::manager::ClientFor {
    Arc::new(move |controller: &str| {
        let user = format!("system:serviceaccount:{CONTROLLER_NAMESPACE}:{controller}");
        controller_client(&pki, &url, &user, Some(SERVICE_ACCOUNTS_GROUP))
    })
}

/// 64 random bits for the leader-election identity (`<member>_<hex>`, as kube-controller-manager
/// uses `<hostname>_<uuid>`), so a restarted member is a new candidate.
fn rand_suffix() -> u64 {
    rand::random()
}

/// `skerry kubeconfig`: a kubeconfig from an existing PKI (never creates one).
/// The cluster PKI that `skerry server` made, from `--pki-dir`, else `<--data-dir>/pki`, else
/// the default data dir's; an error says to start a server first.
pub fn load_pki(
    data_dir: Option<&std::path::Path>,
    pki_dir: Option<&std::path::Path>,
) -> Result<Pki> {
    let pki_dir = match (pki_dir, data_dir) {
        (Some(dir), _) => dir.to_path_buf(),
        (None, Some(data)) => data.join(PKI_DIR),
        (None, None) => {
            let home =
                std::env::var_os("HOME").context("no --data-dir given and $HOME is not set")?;
            std::path::PathBuf::from(home)
                .join(DATA_DIR_DEFAULT)
                .join(PKI_DIR)
        }
    };
    if !pki_dir.join(CA_CERT_FILE).exists() {
        anyhow::bail!(
            "no cluster PKI in {}: start `skerry server` first (or pass --data-dir/--pki-dir)",
            pki_dir.display()
        );
    }
    Pki::load_or_create(&pki_dir, &[]).context("load the PKI")
}

pub fn kubeconfig(args: KubeconfigArgs) -> Result<()> {
    let pki = load_pki(args.data_dir.as_deref(), args.pki_dir.as_deref())?;
    let issued;
    let (user, cert, key) = match &args.user {
        Some(user) => {
            let groups: Vec<&str> = args.group.iter().map(String::as_str).collect();
            issued = pki
                .issue_client_cert(user, &groups, args.valid_for)
                .with_context(|| format!("issue a client certificate for {user}"))?;
            (
                user.as_str(),
                issued.cert_pem.as_str(),
                issued.key_pem.as_str(),
            )
        }
        None => (
            ADMIN_USER,
            pki.admin().cert_pem.as_str(),
            pki.admin().key_pem.as_str(),
        ),
    };
    let config = Kubeconfig {
        server_url: &args.server,
        ca_cert_pem: pki.ca_cert_pem(),
        user,
        client_cert_pem: cert,
        client_key_pem: key,
    };
    match &args.out {
        Some(path) => config
            .write(path)
            .with_context(|| format!("write {}", path.display())),
        None => {
            print!("{}", config.to_yaml());
            Ok(())
        }
    }
}

/// How the apiserver reaches kubelets (`pods/log`): kubeadm's `apiserver-kubelet-client`
/// certificate in `system:masters`, issued from the cluster CA at each start (kept in memory:
/// nothing else uses it), and the cluster CA as the only trust anchor of kubelets' serving
/// certificates.
fn kubelet_client(pki: &crate::pki::Pki) -> Result<skerry_apiserver::podlogs::KubeletClient> {
    let cert = pki
        .issue_client_cert(
            KUBELET_CLIENT_USER,
            &[crate::pki::ADMIN_GROUP],
            crate::pki::LEAF_VALIDITY,
        )
        .context("issue the apiserver's kubelet client certificate")?;
    let roots = skerry_tls::config::roots([pki.ca_cert_der().clone()])
        .context("the cluster CA as kubelets' trust anchor")?;
    let tls = skerry_tls::config::client_config(
        Arc::new(roots),
        Some((cert.cert_chain()?, cert.private_key()?)),
        &[b"http/1.1"],
    )
    .context("the kubelet client's TLS configuration")?;
    Ok(skerry_apiserver::podlogs::KubeletClient { tls: Arc::new(tls) })
}

/// The user the apiserver calls kubelets as (kubeadm's `apiserver-kubelet-client`).
const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";
