//! `skerry`: the one binary. `skerry server` runs a cluster member: the etcd-compatible store
//! (etcd's v3 gRPC API), alone or replicated by Raft across three boxes, and over it the
//! Kubernetes apiserver, the controllers and the scheduler; later issues add the kubelet and
//! the service proxy.
//!
//! This is a thin main, like Kubernetes' `cmd/`: it parses flags, wires the crates together and
//! owns shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
mod agent;
mod client_port;
mod diskalarm;
mod fdlimit;
mod http;
mod kube;
mod kubeconfig;
mod network;
mod node;
mod pki;
mod tls;

use skerry_raft::{ClusterConfig, ClusterState, RaftNode};
use skerry_store::grpc::{EtcdApi, MemberInfo, router};
use skerry_store::{Store, StoreConfig};
use tracing::info;

/// jemalloc instead of glibc's malloc. The gRPC path allocates and frees many small buffers
/// per request on several threads; with glibc, growing per-thread arenas (`sysmalloc`,
/// `mprotect`, page faults) cost ~15% of server CPU in a profile of 64 concurrent puts, and
/// server CPU per put fell from ~80 us to ~46 us with jemalloc. mimalloc was tried too: its
/// eager purging made the kernel zero pages for 38% of the time (`clear_page_erms`).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// etcd's default client URL, so that `etcdctl` with no flags talks to `skerry server`.
const LISTEN_CLIENT_URL_DEFAULT: &str = "http://127.0.0.1:2379";

/// kube-apiserver's secure port.
const APISERVER_PORT_DEFAULT: u16 = 6443;

/// Where the admin kubeconfig is written, inside the data dir.
const ADMIN_KUBECONFIG_FILE: &str = "admin.kubeconfig";

/// The data dir used when none is given: under the user's home, so the embedded default
/// needs no flags and no root.
const DATA_DIR_DEFAULT: &str = ".skerry/store";

#[derive(Parser)]
#[command(
    name = "skerry",
    version,
    about = "Kubernetes as a three-node appliance: an etcd-compatible store replicated by Raft, \
             the Kubernetes API, the controllers and the scheduler"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a member: the store serving etcd's v3 gRPC API (etcd's flag names), alone or with
    /// --initial-cluster in a Raft cluster, and the Kubernetes API (--secure-port), the
    /// controllers and the scheduler over it.
    Server(Box<ServerArgs>),
    /// Write a kubeconfig for the cluster whose PKI `skerry server` created: the admin's
    /// (system:masters), or with --user a new client certificate for that user.
    Kubeconfig(KubeconfigArgs),
    /// Snapshot files made by `etcdctl snapshot save` against skerry.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// Run the node agent alone (containerd, the kubelet) as a node of a cluster whose API
    /// is --server, with the credentials `skerry node-credentials` wrote.
    Agent(Box<agent::AgentArgs>),
    /// Issue a node's credentials for `skerry agent` from the cluster CA of this member's data
    /// dir: a kubeconfig with its client certificate, and its kubelet serving certificate.
    NodeCredentials(agent::NodeCredentialsArgs),
    /// Container images on this node, without a registry.
    Images {
        #[command(subcommand)]
        command: ImagesCommand,
    },
}

#[derive(Subcommand)]
enum ImagesCommand {
    /// Import OCI image layout and docker-archive tarballs (`docker save`, `skopeo copy ...
    /// docker-archive:`, optionally gzip-compressed) into the node's containerd, where pods
    /// find them. Each archive is checked whole before anything is written.
    Import(ImagesImportArgs),
}

#[derive(Parser)]
struct ImagesImportArgs {
    /// The tarballs.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The server's data directory [default: ~/.skerry/store]; its containerd's socket is
    /// <data-dir>/agent/run/containerd.sock.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The containerd socket to import into instead (the kubelet's flag: unix:///path or a
    /// path), when the node uses a containerd of its own.
    #[arg(long)]
    container_runtime_endpoint: Option<String>,
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Create a new data dir from a snapshot file.
    Restore {
        /// The snapshot file.
        file: PathBuf,
        /// The data dir to create; it must not hold a store.
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Check that a snapshot file is complete and intact.
    Verify { file: PathBuf },
}

#[derive(Parser)]
struct KubeconfigArgs {
    /// The server's data directory [default: ~/.skerry/store]; its PKI is <data-dir>/pki.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The PKI directory, when the server was started with --pki-dir.
    #[arg(long)]
    pki_dir: Option<PathBuf>,
    /// The API's URL.
    #[arg(long, default_value = "https://127.0.0.1:6443")]
    server: String,
    /// Issue a client certificate for this user instead of using the admin's.
    #[arg(long)]
    user: Option<String>,
    /// The user's group (the certificate's O), with --user.
    #[arg(long, requires = "user")]
    group: Option<String>,
    /// How long the user's certificate is valid (e.g. 720h), with --user.
    #[arg(long, default_value = "8760h", value_parser = parse_duration, requires = "user")]
    valid_for: Duration,
    /// Where to write it [default: standard output].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Parser)]
struct ServerArgs {
    /// Human-readable name of this member.
    #[arg(long, default_value = "default")]
    name: String,
    /// Path to the data directory [default: ~/.skerry/store].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// URLs to listen on for client traffic, comma-separated (http://IP:PORT).
    #[arg(long, default_value = LISTEN_CLIENT_URL_DEFAULT, value_delimiter = ',')]
    listen_client_urls: Vec<String>,
    /// Extra URLs that serve only /metrics and /health (etcd's flag), comma-separated:
    /// http://IP:PORT, or https:// with --cert-file and --key-file.
    #[arg(long, value_delimiter = ',')]
    listen_metrics_urls: Vec<String>,
    /// Client URLs to advertise to the cluster, comma-separated [default: the listen URLs].
    #[arg(long, value_delimiter = ',')]
    advertise_client_urls: Vec<String>,
    /// Port of the Kubernetes API (HTTPS; kube-apiserver's flag and default). 0 serves no
    /// Kubernetes API, only the store.
    #[arg(long, default_value_t = APISERVER_PORT_DEFAULT)]
    secure_port: u16,
    /// Address the Kubernetes API listens on (kube-apiserver's flag and default: every
    /// interface, so the other boxes and kubectl users reach it).
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: std::net::IpAddr,
    /// Extra DNS names and IPs for the API's serving certificate, comma-separated.
    #[arg(long, value_delimiter = ',')]
    tls_san: Vec<String>,
    /// The range Services get ClusterIPs from (kube-apiserver's flag; kubeadm's default).
    #[arg(long, default_value = skerry_apiserver::ipalloc::SERVICE_CIDR_DEFAULT)]
    service_cluster_ip_range: String,
    /// The range NodePort and LoadBalancer Services get node ports from (kube-apiserver's
    /// flag and default): `min-max`.
    #[arg(long, default_value = skerry_apiserver::portalloc::NODE_PORT_RANGE_DEFAULT)]
    service_node_port_range: String,
    /// Give every Node a pod range carved from --cluster-cidr (kube-controller-manager's
    /// flag; on by default, as k3s): `--allocate-node-cidrs=false` leaves podCIDRs to others.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    allocate_node_cidrs: bool,
    /// The prefix length of each node's pod range [default: 24 for IPv4, 64 for IPv6].
    #[arg(long)]
    node_cidr_mask_size: Option<u8>,
    /// Static bearer tokens (kube-apiserver's CSV format: token,user,uid,"group1,group2").
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// The cluster's PKI (CA, serving and admin certs, service-account key) [default:
    /// <data-dir>/pki, created on first start]. Point every member at a copy of the same
    /// directory to share one CA.
    #[arg(long)]
    pki_dir: Option<PathBuf>,
    /// The space quota in bytes (etcd's flag): past it this member raises the cluster-wide
    /// NOSPACE alarm and writes are refused until `etcdctl alarm disarm`. 0 is etcd's
    /// default (2 GiB), a negative number disables the quota. It bounds the store file's
    /// length (the DB SIZE of `etcdctl endpoint status`), which grows by doubling.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    quota_backend_bytes: i64,
    /// Interval of watch progress notifications (etcd's flag; e.g. 10m, 5s, 500ms).
    #[arg(long = "experimental-watch-progress-notify-interval", default_value = "10m", value_parser = parse_duration)]
    progress_notify_interval: Duration,
    /// Log level filter (tracing's syntax; RUST_LOG overrides).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Every member of a new cluster and its peer URL: n1=http://IP:2380,n2=... Without it
    /// skerry runs a single store with no peers.
    #[arg(long)]
    initial_cluster: Option<String>,
    /// `new` to bootstrap the cluster from --initial-cluster; `existing` to join one.
    #[arg(long, default_value = "new")]
    initial_cluster_state: String,
    /// Token that keeps members of different clusters from mixing (part of every id).
    #[arg(long, default_value = skerry_raft::config::CLUSTER_TOKEN_DEFAULT)]
    initial_cluster_token: String,
    /// URLs to listen on for peer traffic, comma-separated [default: this member's URL in
    /// --initial-cluster].
    #[arg(long)]
    listen_peer_urls: Option<String>,
    /// This member's peer URLs as the others reach them; must match --initial-cluster.
    #[arg(long)]
    initial_advertise_peer_urls: Option<String>,
    /// Time between leader heartbeats, in milliseconds (etcd's flag; etcd's default is 100).
    #[arg(long, default_value_t = skerry_raft::config::HEARTBEAT_INTERVAL_DEFAULT.as_millis() as u64)]
    heartbeat_interval: u64,
    /// Time a follower waits for a heartbeat before it stands for election, in milliseconds
    /// (etcd's flag; etcd's default is 1000). At least 5 heartbeats.
    #[arg(long, default_value_t = skerry_raft::config::ELECTION_TIMEOUT_DEFAULT.as_millis() as u64)]
    election_timeout: u64,
    /// Applied entries between compactions of the Raft log; a member further behind than
    /// the log reaches gets the store as a snapshot.
    #[arg(long, default_value_t = skerry_raft::config::SNAPSHOT_COUNT_DEFAULT)]
    snapshot_count: u64,
    /// Entries kept in the log below the applied index when it is compacted, so a follower
    /// a little behind catches up from the log.
    #[arg(long = "experimental-snapshot-catchup-entries", default_value_t = skerry_raft::config::SNAPSHOT_CATCHUP_ENTRIES_DEFAULT)]
    snapshot_catchup_entries: u64,
    /// This member's peer certificate (PEM), for https:// peer URLs: presented to peers both
    /// as a server and as a client, so it needs both key usages.
    #[arg(long)]
    peer_cert_file: Option<PathBuf>,
    /// The private key of --peer-cert-file (PEM).
    #[arg(long)]
    peer_key_file: Option<PathBuf>,
    /// The CA (PEM) that signs every member's peer certificate; peers signed by others are
    /// refused.
    #[arg(long)]
    peer_trusted_ca_file: Option<PathBuf>,
    /// The server certificate (PEM) for https:// client URLs.
    #[arg(long)]
    cert_file: Option<PathBuf>,
    /// The private key of --cert-file (PEM).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// The CA (PEM) that client certificates must be signed by (with --client-cert-auth).
    #[arg(long)]
    trusted_ca_file: Option<PathBuf>,
    /// Require clients to present a certificate signed by --trusted-ca-file.
    #[arg(long)]
    client_cert_auth: bool,
    /// The node agent (the kubelet) that runs this member's pods.
    #[command(flatten)]
    node: node::NodeArgs,
}

/// Where a cluster member keeps its Raft log, inside the data dir.
const RAFT_DIR: &str = "raft";

/// The cluster description from the flags, when --initial-cluster is given.
fn cluster_config(args: &ServerArgs) -> Result<Option<ClusterConfig>> {
    let Some(initial) = &args.initial_cluster else {
        for (flag, given) in [
            ("--listen-peer-urls", args.listen_peer_urls.is_some()),
            (
                "--initial-advertise-peer-urls",
                args.initial_advertise_peer_urls.is_some(),
            ),
            ("--peer-cert-file", args.peer_cert_file.is_some()),
        ] {
            if given {
                bail!("{flag} needs --initial-cluster");
            }
        }
        return Ok(None);
    };
    let state: ClusterState = args.initial_cluster_state.parse()?;
    let own_urls: Vec<String> = initial
        .split(',')
        .filter_map(|item| item.split_once('='))
        .filter(|(name, _)| *name == args.name)
        .map(|(_, url)| url.to_string())
        .collect();
    if let Some(advertised) = &args.initial_advertise_peer_urls {
        let mut advertised: Vec<String> = advertised.split(',').map(str::to_string).collect();
        advertised.sort();
        let mut own = own_urls.clone();
        own.sort();
        if advertised != own {
            bail!(
                "--initial-advertise-peer-urls {} does not match {}'s URLs in --initial-cluster ({})",
                advertised.join(","),
                args.name,
                own.join(",")
            );
        }
    }
    let listen = match &args.listen_peer_urls {
        Some(listen) => listen.clone(),
        None => own_urls.join(","),
    };
    let peer_tls = match (
        &args.peer_cert_file,
        &args.peer_key_file,
        &args.peer_trusted_ca_file,
    ) {
        (None, None, None) => None,
        (Some(cert), Some(key), Some(ca)) => Some(skerry_raft::tls::PeerTlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            trusted_ca: ca.clone(),
        }),
        _ => bail!("--peer-cert-file, --peer-key-file and --peer-trusted-ca-file go together"),
    };
    let config = ClusterConfig::new(
        &args.name,
        initial,
        &args.initial_cluster_token,
        state,
        &listen,
        Duration::from_millis(args.heartbeat_interval),
        Duration::from_millis(args.election_timeout),
    )?
    .with_peer_tls(peer_tls)?;
    let mut config = config;
    if args.snapshot_count == 0 {
        bail!("--snapshot-count must be at least 1");
    }
    config.snapshot_count = args.snapshot_count;
    config.snapshot_catchup_entries = args.snapshot_catchup_entries;
    Ok(Some(config))
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("skerry: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Server(args) => server(*args),
        Command::Kubeconfig(args) => kube::kubeconfig(args),
        Command::Agent(args) => agent::agent(*args),
        Command::NodeCredentials(args) => agent::node_credentials(args),
        Command::Snapshot {
            command: SnapshotCommand::Restore { file, data_dir },
        } => {
            let revision = skerry_store::snapshot::restore(&file, &data_dir)
                .with_context(|| format!("restore {}", file.display()))?;
            println!("restored revision {revision} into {}", data_dir.display());
            Ok(())
        }
        Command::Snapshot {
            command: SnapshotCommand::Verify { file },
        } => {
            skerry_store::snapshot::verify(&file)
                .with_context(|| format!("verify {}", file.display()))?;
            println!("{}: intact skerry snapshot", file.display());
            Ok(())
        }
        Command::Images {
            command: ImagesCommand::Import(args),
        } => images_import(args),
    }
}

/// `skerry images import`: each file into containerd's `k8s.io` namespace, one line per image.
fn images_import(args: ImagesImportArgs) -> Result<()> {
    let socket = match &args.container_runtime_endpoint {
        Some(endpoint) => skerry_node::cri::socket_path(endpoint)?,
        None => {
            skerry_node::containerd::Layout::new(&data_dir_or_default(args.data_dir.clone())?)
                .socket
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async {
        let api = skerry_node::images::k8s_api(&socket);
        let mut failed = 0;
        for file in &args.files {
            match skerry_node::images::import_file(&api, file).await {
                Ok(report) => {
                    for (name, digest) in &report.images {
                        println!("{name} {digest}");
                    }
                }
                Err(err) => {
                    failed += 1;
                    eprintln!("skerry: {}: {err}", file.display());
                }
            }
        }
        if failed > 0 {
            bail!(
                "{failed} of {} files not imported (containerd at {})",
                args.files.len(),
                socket.display()
            );
        }
        Ok(())
    })
}

/// `--data-dir`, else the default under `$HOME`.
fn data_dir_or_default(data_dir: Option<PathBuf>) -> Result<PathBuf> {
    match data_dir {
        Some(dir) => Ok(dir),
        None => {
            let home =
                std::env::var_os("HOME").context("no --data-dir given and $HOME is not set")?;
            Ok(PathBuf::from(home).join(DATA_DIR_DEFAULT))
        }
    }
}

/// Logs to stderr at `--log-level` (RUST_LOG overrides).
fn init_logging(level: &str) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .context("parse --log-level")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    Ok(())
}

fn server(mut args: ServerArgs) -> Result<()> {
    // The node's flags are checked before anything starts, as the kubelet refuses bad ones.
    args.node.validate().map_err(anyhow::Error::msg)?;
    // Pods resolve through the cluster DNS each node serves, at the `.10` of the Service
    // range, unless the node's network is off or another address is named.
    if args.node.cluster_dns.is_empty() && !args.node.disable_network {
        args.node.cluster_dns = network::cluster_dns_of(&args.service_cluster_ip_range)
            .into_iter()
            .collect();
    }
    init_logging(&args.log_level)?;
    match fdlimit::raise_open_file_limit() {
        Ok(fdlimit::Raised::From(soft, hard)) => {
            info!(from = soft, to = hard, "raised the open-file limit")
        }
        Ok(fdlimit::Raised::Already) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }

    let addrs = args
        .listen_client_urls
        .iter()
        .map(|url| parse_client_url(url).with_context(|| format!("--listen-client-urls {url}")))
        .collect::<Result<Vec<_>>>()?;
    let advertise = if args.advertise_client_urls.is_empty() {
        args.listen_client_urls.clone()
    } else {
        args.advertise_client_urls.clone()
    };
    for url in &advertise {
        parse_client_url(url).with_context(|| format!("--advertise-client-urls {url}"))?;
    }
    let metrics_addrs = args
        .listen_metrics_urls
        .iter()
        .map(|url| parse_client_url(url).with_context(|| format!("--listen-metrics-urls {url}")))
        .collect::<Result<Vec<_>>>()?;
    let https = args
        .listen_client_urls
        .iter()
        .chain(&args.listen_metrics_urls)
        .any(|url| url.starts_with("https://"));
    let client_tls = match (&args.cert_file, &args.key_file, https) {
        (Some(cert), Some(key), true) => Some(tls::acceptor(
            cert,
            key,
            args.trusted_ca_file.as_deref(),
            args.client_cert_auth,
        )?),
        (None, None, false) => {
            if args.client_cert_auth || args.trusted_ca_file.is_some() {
                bail!("--client-cert-auth and --trusted-ca-file need https:// client URLs");
            }
            None
        }
        (_, _, true) => bail!("https:// client URLs need --cert-file and --key-file"),
        (_, _, false) => bail!("--cert-file and --key-file need https:// client URLs"),
    };
    let mut cluster = cluster_config(&args)?;
    let data_dir = data_dir_or_default(args.data_dir.clone())?;
    let joining = cluster
        .as_ref()
        .is_some_and(|c| c.state == ClusterState::Existing);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start runtime")?;
    runtime.block_on(async move {
        // Bind before opening the store: a port in use is reported without touching the data.
        let mut listeners = Vec::new();
        for (url, addr) in args.listen_client_urls.iter().zip(&addrs) {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listen on {url}"))?;
            listeners.push(listener);
        }
        let mut metrics_listeners = Vec::new();
        for (url, addr) in args.listen_metrics_urls.iter().zip(&metrics_addrs) {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listen on {url} (--listen-metrics-urls)"))?;
            metrics_listeners.push(listener);
        }
        let api_listener = if args.secure_port != 0 {
            let addr = SocketAddr::new(args.bind_address, args.secure_port);
            Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("listen on {addr} (--secure-port)"))?,
            )
        } else {
            None
        };
        let mut config = StoreConfig::new(&data_dir);
        config.progress_notify_interval = args.progress_notify_interval;
        config.quota = skerry_store::quota::quota_from_flag(args.quota_backend_bytes);
        match config.quota {
            None => info!("backend quota disabled (--quota-backend-bytes < 0)"),
            Some(bytes) if bytes > skerry_store::quota::QUOTA_BYTES_SUGGESTED_MAX => {
                tracing::warn!(
                    quota_bytes = bytes,
                    suggested_max_bytes = skerry_store::quota::QUOTA_BYTES_SUGGESTED_MAX,
                    "backend quota above the suggested maximum"
                )
            }
            Some(bytes) => info!(quota_bytes = bytes, "backend quota enabled"),
        }
        let store_exists = data_dir.join(skerry_store::store::DB_FILE_NAME).exists();
        if let Some(cluster) = cluster.as_mut() {
            config.replicated = true;
            if joining && !store_exists {
                // `member add` chose our id; a member of the running cluster tells us.
                let answer = ask_to_join(cluster).await?;
                cluster.join(answer.cluster_id, answer.member_id, &answer.members);
            }
            // A member that joined earlier has the ids the cluster gave it in its store.
            config.identity =
                (!(joining && store_exists)).then_some((cluster.cluster_id, cluster.id));
        }
        let store = Store::open(config).context("open store")?;
        if let Some(cluster) = cluster.as_mut()
            && joining
            && store_exists
        {
            let members: Vec<(u64, String)> = store
                .members()?
                .into_iter()
                .filter_map(|m| m.peer_urls.first().map(|u| (m.id, u.clone())))
                .collect();
            if members.is_empty() {
                // Stopped before the cluster sent it anything: ask again.
                let answer = ask_to_join(cluster).await?;
                if answer.member_id != store.member_id() {
                    bail!(
                        "the cluster knows this member's peer URL as member {:x}, but the data \
                         dir belongs to member {:x}; wipe it and start again",
                        answer.member_id,
                        store.member_id()
                    );
                }
                cluster.join(answer.cluster_id, answer.member_id, &answer.members);
            } else {
                cluster.join(store.cluster_id(), store.member_id(), &members);
            }
        }
        let mut node = None;
        let mut own_peer_urls = Vec::new();
        if let Some(cluster) = &cluster {
            node = Some(
                RaftNode::start(cluster, &data_dir.join(RAFT_DIR), store.clone())
                    .await
                    .context("start raft")?,
            );
            own_peer_urls = cluster.advertise_peer_urls();
            println!(
                "skerry: member {} ({:x}) of cluster {:x}, {} members, peers on {}",
                cluster.name,
                cluster.id,
                cluster.cluster_id,
                cluster.members.len(),
                cluster.listen_peer
            );
        }
        if let Some(cluster) = &cluster {
            // Announce our client URLs through the log once there is a leader to take it, so
            // every member's MemberList shows them (etcd's "publish").
            let store = store.clone();
            let (id, name, urls) = (cluster.id, cluster.name.clone(), advertise.clone());
            tokio::spawn(async move {
                while let Err(e) = store.publish_member(id, &name, urls.clone()).await {
                    tracing::debug!(error = %e, "publishing member attributes; will retry");
                    tokio::time::sleep(PUBLISH_RETRY).await;
                }
            });
        }
        let api = EtcdApi::new(
            store.clone(),
            MemberInfo {
                name: args.name.clone(),
                client_urls: advertise,
                peer_urls: own_peer_urls,
            },
        );
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut apiserver_task = None;
        let mut node_agent = None;
        if let Some(listener) = api_listener {
            let started = kube::start(&args, &data_dir, store.clone(), listener, stop_rx.clone())
                .context("start the Kubernetes API")?;
            apiserver_task = Some(started.task);
            let log = if cluster.is_some() {
                diskalarm::Log::Raft
            } else {
                diskalarm::Log::Single
            };
            node::start_disk_alarm(
                &args.node,
                &node::Identity::Pki(started.pki.clone()),
                &started.local_url,
                log,
                stop_rx.clone(),
            );
            node_agent = node::start(
                &args.node,
                &data_dir,
                node::Identity::Pki(started.pki),
                &started.local_url,
                stop_rx.clone(),
            )
            .await;
        }
        let mut servers = Vec::new();
        // Each client URL: gRPC (HTTP/2) and the HTTP face (HTTP/1) on one port.
        let face = Arc::new(http::HttpFace::new(
            api.clone(),
            store.clone(),
            true,
            stop_rx.clone(),
        ));
        for (url, listener) in args.listen_client_urls.iter().zip(listeners) {
            let mut stop = stop_rx.clone();
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let (true, Some(acceptor)) = (url.starts_with("https://"), client_tls.clone()) {
                let incoming =
                    client_port::serve_tls(listener, acceptor, face.clone(), true, stop_rx.clone());
                let incoming = tokio_stream::wrappers::ReceiverStream::new(incoming);
                let serve = router(api.clone()).serve_with_incoming_shutdown(incoming, shutdown);
                servers.push(tokio::spawn(serve));
            } else {
                let incoming =
                    client_port::serve_plain(listener, face.clone(), true, stop_rx.clone());
                let incoming = tokio_stream::wrappers::ReceiverStream::new(incoming);
                let serve = router(api.clone()).serve_with_incoming_shutdown(incoming, shutdown);
                servers.push(tokio::spawn(serve));
            }
            println!(
                "skerry: serving etcd v3 API on {url} (data dir {})",
                data_dir.display()
            );
        }
        // Each metrics URL: /metrics and /health only, over HTTP/1.
        let metrics_face = Arc::new(http::HttpFace::new(
            api.clone(),
            store.clone(),
            false,
            stop_rx.clone(),
        ));
        for (url, listener) in args.listen_metrics_urls.iter().zip(metrics_listeners) {
            // Nothing is routed to gRPC on these: the receivers stay empty.
            if let (true, Some(acceptor)) = (url.starts_with("https://"), client_tls.clone()) {
                drop(client_port::serve_tls(
                    listener,
                    acceptor,
                    metrics_face.clone(),
                    false,
                    stop_rx.clone(),
                ));
            } else {
                drop(client_port::serve_plain(
                    listener,
                    metrics_face.clone(),
                    false,
                    stop_rx.clone(),
                ));
            }
            println!("skerry: serving /metrics and /health on {url}");
        }
        info!(name = %args.name, data_dir = %data_dir.display(), "skerry server started");
        let removed = async {
            let Some(handle) = node.as_ref().map(RaftNode::handle) else {
                return std::future::pending().await;
            };
            while !handle.removed() {
                tokio::time::sleep(REMOVED_POLL).await;
            }
        };
        let was_removed = tokio::select! {
            _ = shutdown_signal() => false,
            _ = removed => true,
        };
        info!("shutting down");
        let _ = stop_tx.send(true);
        for server in servers {
            match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
                Ok(Ok(Ok(()))) | Err(_) => {}
                Ok(Ok(Err(e))) => eprintln!("skerry: server: {e}"),
                Ok(Err(e)) => eprintln!("skerry: server task: {e}"),
            }
        }
        drop(api);
        if let Some(agent) = node_agent {
            agent.stop().await;
        }
        if let Some(task) = apiserver_task {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, task).await;
        }
        if let Some(node) = node {
            // SIGTERM or Ctrl-C: a leader hands over before it goes, so a rolling restart
            // costs no election timeout.
            node.stop_gracefully();
        }
        store.close();
        if was_removed {
            bail!("this member was removed from the cluster (etcdctl member remove); stopped");
        }
        Ok::<(), anyhow::Error>(())
    })
}

/// How long a joining member keeps asking the running cluster for its id: long enough for a
/// `member add` typed just after starting it.
const JOIN_ASK_FOR: Duration = Duration::from_secs(30);

/// Asks the other members in --initial-cluster, in turn, what id `member add` gave our peer
/// URL, until one knows (`--initial-cluster-state existing`).
async fn ask_to_join(cluster: &ClusterConfig) -> Result<skerry_raft::transport::JoinAnswer> {
    let my_urls = cluster.advertise_peer_urls();
    let my_url = my_urls
        .first()
        .context("this member has no peer URL in --initial-cluster")?;
    let deadline = tokio::time::Instant::now() + JOIN_ASK_FOR;
    let mut last = String::from("no other member in --initial-cluster");
    loop {
        for (_, addr) in cluster.peer_addrs()? {
            match skerry_raft::transport::ask_to_join(addr, my_url, &cluster.peer_tls).await {
                Ok(answer) if answer.member_id != 0 => {
                    info!(
                        member = format_args!("{:x}", answer.member_id),
                        cluster = format_args!("{:x}", answer.cluster_id),
                        "the running cluster knows this member"
                    );
                    return Ok(answer);
                }
                Ok(_) => {
                    last = format!(
                        "{addr} does not know {my_url}: run `etcdctl member add {} --peer-urls={my_url}` first",
                        cluster.name
                    );
                }
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("--initial-cluster-state existing: cannot join: {last}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Pause between attempts to publish this member's attributes while no leader takes them.
const PUBLISH_RETRY: Duration = Duration::from_millis(500);

/// How often the server checks whether the cluster removed this member.
const REMOVED_POLL: Duration = Duration::from_millis(200);
/// How long open streams (watches, keep-alives) get to finish at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Parses an etcd client URL (`http://IP:PORT` or `http://localhost:PORT`).
fn parse_client_url(url: &str) -> Result<SocketAddr> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("not a URL: expected http://IP:PORT");
    };
    match scheme {
        "http" | "https" => {}
        other => bail!("unsupported scheme {other:?}: expected http or https"),
    }
    let host_port = rest.trim_end_matches('/');
    if host_port.contains('/') {
        bail!("a client URL has no path");
    }
    let host_port = if let Some(port) = host_port.strip_prefix("localhost:") {
        format!("127.0.0.1:{port}")
    } else {
        host_port.to_string()
    };
    host_port
        .parse::<SocketAddr>()
        .map_err(|_| anyhow::anyhow!("expected http://IP:PORT with a numeric IP and port"))
}

/// Parses a Go-style duration: `10m`, `5s`, `500ms`, `1h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 10m, 5s or 500ms"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("{text:?} has no unit: use ms, s, m or h")),
    };
    if d.is_zero() {
        return Err("the interval must be positive".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_urls_parse_as_etcd_writes_them() {
        assert_eq!(
            parse_client_url("http://127.0.0.1:2379").ok(),
            "127.0.0.1:2379".parse().ok()
        );
        assert_eq!(
            parse_client_url("http://localhost:2379").ok(),
            "127.0.0.1:2379".parse().ok()
        );
        assert!(parse_client_url("127.0.0.1:2379").is_err());
        assert!(parse_client_url("http://127.0.0.1").is_err());
        assert!(parse_client_url("ftp://127.0.0.1:1").is_err());
        assert!(parse_client_url("https://127.0.0.1:2379").is_ok());
    }

    /// `skerry --help` and `skerry server --help` say what a member runs, not just the store.
    #[test]
    fn help_names_everything_a_member_runs() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let about = cli.get_about().map(ToString::to_string).unwrap_or_default();
        for part in [
            "store",
            "Raft",
            "Kubernetes API",
            "controllers",
            "scheduler",
        ] {
            assert!(about.contains(part), "{part} missing from {about:?}");
        }
        let server = cli
            .find_subcommand("server")
            .expect("the server subcommand");
        let about = server
            .get_about()
            .map(ToString::to_string)
            .unwrap_or_default();
        for part in [
            "etcd's v3 gRPC API",
            "Kubernetes API",
            "controllers",
            "scheduler",
        ] {
            assert!(about.contains(part), "{part} missing from {about:?}");
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("x").is_err());
    }
}
