//! Wiring of the Kubernetes API into `skerry server`: the PKI, the TLS configuration, the
//! authenticators, the apiserver itself and the admin kubeconfig.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use skerry_apiserver::auth::serviceaccount::{ISSUER_DEFAULT, TokenIssuer};
use skerry_apiserver::auth::token::TokenFile;
use skerry_apiserver::auth::{Authenticator, x509};
use skerry_apiserver::handler::Config;
use skerry_apiserver::ipalloc::ServiceCidr;
use skerry_apiserver::{ApiServer, compactor};
use skerry_store::Store;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::kubeconfig::Kubeconfig;
use crate::pki::{ADMIN_USER, CA_CERT_FILE, PKI_DIR, Pki};
use crate::{ADMIN_KUBECONFIG_FILE, DATA_DIR_DEFAULT, KubeconfigArgs, ServerArgs};

/// Pause between attempts to seed a cluster's store while it has no quorum yet.
const START_RETRY: Duration = Duration::from_secs(1);

/// Loads (or creates) the PKI, writes the admin kubeconfig, and spawns the apiserver, which
/// starts serving once the store accepts writes (a cluster needs its quorum first).
pub fn start(
    args: &ServerArgs,
    data_dir: &Path,
    store: Store,
    listener: TcpListener,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>> {
    let pki_dir = args
        .pki_dir
        .clone()
        .unwrap_or_else(|| data_dir.join(PKI_DIR));
    let mut names = args.tls_san.clone();
    if !args.bind_address.is_unspecified() {
        names.push(args.bind_address.to_string());
    }
    let pki = Pki::load_or_create(&pki_dir, &names).context("load the PKI")?;
    let chain = CertificateDer::pem_slice_iter(pki.serving().cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("read the serving certificate")?;
    let key = PrivateKeyDer::from_pem_slice(pki.serving().key_pem.as_bytes())
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
    };
    Ok(tokio::spawn(async move {
        // A new cluster's store is seeded once it takes writes (a cluster needs its quorum).
        while let Err(e) = skerry_apiserver::startup::bootstrap(&store, &service_cidr, port).await {
            tracing::info!(error = %e.message, "the Kubernetes API waits for the store");
            tokio::time::sleep(START_RETRY).await;
        }
        let api = ApiServer::start(store, config);
        tracing::info!(%url, "Kubernetes API ready");
        skerry_apiserver::server::serve(api, listener, Arc::new(tls), stop).await;
    }))
}

/// `skerry kubeconfig`: a kubeconfig from an existing PKI (never creates one).
pub fn kubeconfig(args: KubeconfigArgs) -> Result<()> {
    let pki_dir = match (&args.pki_dir, &args.data_dir) {
        (Some(dir), _) => dir.clone(),
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
    let pki = Pki::load_or_create(&pki_dir, &[]).context("load the PKI")?;
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
