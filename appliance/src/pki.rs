//! The cluster's PKI in `<data-dir>/pki/`: the cluster CA, the apiserver's serving certificate,
//! the admin's client certificate and the service-account signing key pair.
//!
//! File names follow kubeadm's (`ca.crt`, `apiserver.crt`, `sa.key`, ...). The first start of
//! `skerry server` creates every piece; later starts load them. Keys are ECDSA P-256 (rcgen with
//! ring), written 0600 in a 0700 directory, each file atomically (temporary file, fsync, rename,
//! fsync of the directory) so a crash leaves the old file or the new one, never half of one.
//!
//! Invariants: the CA and the service-account key are never regenerated over existing files — a
//! new CA would orphan every issued certificate and a new key every issued token; a PKI
//! directory with some pieces missing, or a piece that does not parse, does not match its key or
//! was not signed by the CA, is an error that names the file. The two leaf certificates are
//! re-issued from the existing CA (with fresh keys) only when they are about to expire, or, for
//! the serving certificate, when it does not cover a name the server is now asked to answer to.

// The lead wires `Pki` into `skerry server`; until then nothing in the binary calls it.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData as _, SanType,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use time::OffsetDateTime;
use x509_parser::extensions::GeneralName;

/// The PKI directory inside the data dir.
pub const PKI_DIR: &str = "pki";
/// The cluster CA certificate (kubeadm's name).
pub const CA_CERT_FILE: &str = "ca.crt";
/// The cluster CA key.
pub const CA_KEY_FILE: &str = "ca.key";
/// The apiserver's serving certificate.
pub const SERVING_CERT_FILE: &str = "apiserver.crt";
/// The apiserver's serving key.
pub const SERVING_KEY_FILE: &str = "apiserver.key";
/// The admin client certificate.
pub const ADMIN_CERT_FILE: &str = "admin.crt";
/// The admin client key.
pub const ADMIN_KEY_FILE: &str = "admin.key";
/// The service-account signing key (PKCS#8 PEM).
pub const SA_KEY_FILE: &str = "sa.key";
/// The service-account public key (SubjectPublicKeyInfo PEM).
pub const SA_PUBLIC_FILE: &str = "sa.pub";

/// Every file of a complete PKI directory.
const ALL_FILES: [&str; 8] = [
    CA_CERT_FILE,
    CA_KEY_FILE,
    SERVING_CERT_FILE,
    SERVING_KEY_FILE,
    ADMIN_CERT_FILE,
    ADMIN_KEY_FILE,
    SA_KEY_FILE,
    SA_PUBLIC_FILE,
];

/// The admin's user name and group (kubeadm's `kubernetes-admin` in `system:masters`).
pub const ADMIN_USER: &str = "kubernetes-admin";
/// The group that RBAC never restricts.
pub const ADMIN_GROUP: &str = "system:masters";
/// The CA's CommonName (kubeadm's).
const CA_COMMON_NAME: &str = "kubernetes";
/// The serving certificate's CommonName (kubeadm's).
const SERVING_COMMON_NAME: &str = "kube-apiserver";

/// Lifetime of the CA: ten years, as kubeadm's and client-go's `NewSelfSignedCACert`.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Lifetime of leaf certificates: one year, as kubeadm's.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back `notBefore` is set, so members whose clocks are a little behind the one that
/// issued a certificate accept it at once (kubeadm's `CertificateBackdate`, five minutes).
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Leaf certificates with less than this left are re-issued at start-up. kubeadm warns at 30
/// days; a monthly restart keeps a cluster renewed.
pub const LEAF_RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// DNS names every serving certificate carries besides the host's: `localhost` and the names
/// pods use for the `kubernetes` Service (kubeadm's list, cluster domain `cluster.local`).
pub const SERVING_DNS_NAMES: [&str; 5] = [
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];
/// Addresses every serving certificate carries: the loopbacks.
pub const SERVING_IPS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::LOCALHOST),
    IpAddr::V6(Ipv6Addr::LOCALHOST),
];

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertifiedKey {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
}

/// The loaded PKI.
pub struct Pki {
    dir: PathBuf,
    ca_cert_pem: String,
    ca_cert_der: CertificateDer<'static>,
    ca: Issuer<'static, KeyPair>,
    serving: CertifiedKey,
    admin: CertifiedKey,
    service_account_key: KeyPair,
}

impl Pki {
    /// Loads the PKI in `dir`, creating it if the directory holds none of it. `names` are the
    /// extra DNS names and IP addresses (as text) the serving certificate must cover, besides
    /// [`SERVING_DNS_NAMES`], [`SERVING_IPS`] and this host's name.
    pub fn load_or_create(dir: &Path, names: &[String]) -> Result<Pki> {
        let mut wanted = ServingNames::defaults();
        if let Some(host) = hostname() {
            wanted.add(&host);
        }
        for name in names {
            wanted.add(name);
        }
        let present: Vec<&str> = ALL_FILES
            .iter()
            .copied()
            .filter(|f| dir.join(f).exists())
            .collect();
        if present.is_empty() {
            return Pki::create(dir, &wanted);
        }
        let missing: Vec<&str> = ALL_FILES
            .iter()
            .copied()
            .filter(|f| !present.contains(f))
            .collect();
        if !missing.is_empty() {
            bail!(
                "incomplete PKI in {}: {} missing ({} present); restore the missing files from a \
                 backup, or remove the directory to start a new cluster CA",
                dir.display(),
                missing.join(", "),
                present.join(", ")
            );
        }
        Pki::load(dir, &wanted)
    }

    fn create(dir: &Path, wanted: &ServingNames) -> Result<Pki> {
        create_private_dir(dir)?;
        let now = OffsetDateTime::now_utc();
        let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("generate CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, CA_COMMON_NAME);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_VALIDITY;
        let ca_cert = params.self_signed(&ca_key).context("self-sign CA")?;
        let ca_cert_pem = ca_cert.pem();
        write_atomic(
            &dir.join(CA_KEY_FILE),
            ca_key.serialize_pem().as_bytes(),
            0o600,
        )?;
        write_atomic(&dir.join(CA_CERT_FILE), ca_cert_pem.as_bytes(), 0o644)?;
        let ca = Issuer::new(params, ca_key);

        let sa_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .context("generate service-account key")?;
        write_atomic(
            &dir.join(SA_KEY_FILE),
            sa_key.serialize_pem().as_bytes(),
            0o600,
        )?;
        write_atomic(
            &dir.join(SA_PUBLIC_FILE),
            sa_key.public_key_pem().as_bytes(),
            0o644,
        )?;

        let serving = issue_serving(&ca, wanted)?;
        write_pair(dir, SERVING_CERT_FILE, SERVING_KEY_FILE, &serving)?;
        let admin = issue_client(&ca, ADMIN_USER, &[ADMIN_GROUP], LEAF_VALIDITY)?;
        write_pair(dir, ADMIN_CERT_FILE, ADMIN_KEY_FILE, &admin)?;
        tracing::info!(dir = %dir.display(), "created cluster PKI");
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca_cert_der: ca_cert.der().clone(),
            ca_cert_pem,
            ca,
            serving,
            admin,
            service_account_key: sa_key,
        })
    }

    fn load(dir: &Path, wanted: &ServingNames) -> Result<Pki> {
        let ca_cert_pem = read_text(&dir.join(CA_CERT_FILE))?;
        let ca_cert_der = parse_cert_pem(&dir.join(CA_CERT_FILE), &ca_cert_pem)?;
        let ca_key = read_key(&dir.join(CA_KEY_FILE))?;
        {
            let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_cert_der)
                .map_err(|e| anyhow::anyhow!("{}: {e}", dir.join(CA_CERT_FILE).display()))?;
            ensure!(
                ca_cert.is_ca(),
                "{} is not a CA certificate",
                dir.join(CA_CERT_FILE).display()
            );
            ensure!(
                ca_cert.public_key().subject_public_key.data.as_ref() == ca_key.der_bytes(),
                "{} does not belong to {}",
                dir.join(CA_KEY_FILE).display(),
                dir.join(CA_CERT_FILE).display()
            );
            ensure!(
                ca_cert.validity().time_to_expiration().is_some(),
                "the cluster CA {} expired on {}",
                dir.join(CA_CERT_FILE).display(),
                ca_cert.validity().not_after
            );
        }
        let ca = Issuer::from_ca_cert_der(&ca_cert_der, ca_key)
            .with_context(|| format!("read {} as an issuer", dir.join(CA_CERT_FILE).display()))?;

        let sa_key = read_key(&dir.join(SA_KEY_FILE))?;
        let sa_public = read_text(&dir.join(SA_PUBLIC_FILE))?;
        ensure!(
            sa_public.trim() == sa_key.public_key_pem().trim(),
            "{} does not belong to {}",
            dir.join(SA_PUBLIC_FILE).display(),
            dir.join(SA_KEY_FILE).display()
        );

        let mut serving = read_pair(dir, SERVING_CERT_FILE, SERVING_KEY_FILE)?;
        let serving_state = check_leaf(dir, SERVING_CERT_FILE, &serving, &ca_cert_der)?;
        let uncovered = wanted.not_covered_by(&serving_state.names);
        if serving_state.expiring || !uncovered.is_empty() {
            tracing::info!(
                expiring = serving_state.expiring,
                uncovered = ?uncovered,
                "re-issuing the apiserver serving certificate"
            );
            let mut names = wanted.clone();
            // Keep answering to every name the old certificate covered.
            names.dns.extend(serving_state.names.dns.iter().cloned());
            names.ips.extend(serving_state.names.ips.iter().copied());
            serving = issue_serving(&ca, &names)?;
            write_pair(dir, SERVING_CERT_FILE, SERVING_KEY_FILE, &serving)?;
        }
        let mut admin = read_pair(dir, ADMIN_CERT_FILE, ADMIN_KEY_FILE)?;
        if check_leaf(dir, ADMIN_CERT_FILE, &admin, &ca_cert_der)?.expiring {
            tracing::info!("re-issuing the admin client certificate");
            admin = issue_client(&ca, ADMIN_USER, &[ADMIN_GROUP], LEAF_VALIDITY)?;
            write_pair(dir, ADMIN_CERT_FILE, ADMIN_KEY_FILE, &admin)?;
        }
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca_cert_pem,
            ca_cert_der,
            ca,
            serving,
            admin,
            service_account_key: sa_key,
        })
    }

    /// Issues a client certificate for `user` in `groups` (CN and O, as Kubernetes reads
    /// them), valid for `validity`, with a fresh key. At most one group: rcgen keeps one value
    /// per subject attribute type.
    pub fn issue_client_cert(
        &self,
        user: &str,
        groups: &[&str],
        validity: Duration,
    ) -> Result<CertifiedKey> {
        issue_client(&self.ca, user, groups, validity)
    }

    /// The PKI directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster CA certificate, PEM.
    pub fn ca_cert_pem(&self) -> &str {
        &self.ca_cert_pem
    }

    /// The cluster CA certificate, DER (the trust anchor for client certificates).
    pub fn ca_cert_der(&self) -> &CertificateDer<'static> {
        &self.ca_cert_der
    }

    /// The apiserver's serving certificate and key.
    pub fn serving(&self) -> &CertifiedKey {
        &self.serving
    }

    /// The admin client certificate and key.
    pub fn admin(&self) -> &CertifiedKey {
        &self.admin
    }

    /// The service-account signing key, PKCS#8 DER (what the token issuer loads).
    pub fn service_account_key_pkcs8(&self) -> Vec<u8> {
        self.service_account_key.serialize_der()
    }
}

/// The names a serving certificate covers.
#[derive(Clone, Debug, Default)]
struct ServingNames {
    dns: BTreeSet<String>,
    ips: BTreeSet<IpAddr>,
}

impl ServingNames {
    fn defaults() -> Self {
        let mut names = ServingNames::default();
        for name in SERVING_DNS_NAMES {
            names.add(name);
        }
        names.ips.extend(SERVING_IPS);
        names
    }

    /// Adds a DNS name or, if it parses as one, an IP address.
    fn add(&mut self, name: &str) {
        match name.parse::<IpAddr>() {
            Ok(ip) => {
                self.ips.insert(ip);
            }
            Err(_) => {
                self.dns.insert(name.to_ascii_lowercase());
            }
        }
    }

    /// The names of `self` that `covered` lacks.
    fn not_covered_by(&self, covered: &ServingNames) -> Vec<String> {
        let dns = self.dns.difference(&covered.dns).cloned();
        let ips = self.ips.difference(&covered.ips).map(IpAddr::to_string);
        dns.chain(ips).collect()
    }

    fn san_types(&self) -> Result<Vec<SanType>> {
        let mut sans = Vec::new();
        for name in &self.dns {
            let name = name
                .as_str()
                .try_into()
                .with_context(|| format!("{name:?} is not a DNS name a certificate can carry"))?;
            sans.push(SanType::DnsName(name));
        }
        sans.extend(self.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        Ok(sans)
    }
}

/// What a loaded leaf certificate says about itself.
struct LeafState {
    names: ServingNames,
    expiring: bool,
}

/// Checks that a leaf parses, matches its key and was signed by the CA.
fn check_leaf(
    dir: &Path,
    cert_file: &str,
    pair: &CertifiedKey,
    ca_der: &CertificateDer<'_>,
) -> Result<LeafState> {
    let path = dir.join(cert_file);
    let der = parse_cert_pem(&path, &pair.cert_pem)?;
    let key = KeyPair::from_pem(&pair.key_pem)
        .with_context(|| format!("the key of {}", path.display()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let (_, ca) = x509_parser::parse_x509_certificate(ca_der)
        .map_err(|e| anyhow::anyhow!("the cluster CA: {e}"))?;
    ensure!(
        cert.public_key().subject_public_key.data.as_ref() == key.der_bytes(),
        "{} and its key do not match",
        path.display()
    );
    cert.verify_signature(Some(ca.public_key()))
        .map_err(|e| anyhow::anyhow!("{} was not signed by the cluster CA: {e}", path.display()))?;
    let names = san_names(&cert);
    let expiring = cert
        .validity()
        .time_to_expiration()
        .is_none_or(|left| left.whole_seconds() < LEAF_RENEW_BEFORE.as_secs() as i64);
    Ok(LeafState { names, expiring })
}

/// The DNS names and IP addresses in a certificate's subjectAltName.
fn san_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> ServingNames {
    let mut names = ServingNames::default();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => names.add(dns),
                GeneralName::IPAddress(bytes) => {
                    if let Ok(octets) = <[u8; 4]>::try_from(*bytes) {
                        names.ips.insert(IpAddr::from(octets));
                    } else if let Ok(octets) = <[u8; 16]>::try_from(*bytes) {
                        names.ips.insert(IpAddr::from(octets));
                    }
                }
                _ => {}
            }
        }
    }
    names
}

fn leaf_params(common_name: &str, validity: Duration) -> CertificateParams {
    let now = OffsetDateTime::now_utc();
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    params
}

fn issue_serving(ca: &Issuer<'_, KeyPair>, names: &ServingNames) -> Result<CertifiedKey> {
    let mut params = leaf_params(SERVING_COMMON_NAME, LEAF_VALIDITY);
    params.subject_alt_names = names.san_types()?;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // A fresh key per certificate: rcgen derives the serial number from the public key, so
    // this also keeps serials unique.
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("generate serving key")?;
    let cert = params
        .signed_by(&key, ca)
        .context("sign serving certificate")?;
    Ok(CertifiedKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn issue_client(
    ca: &Issuer<'_, KeyPair>,
    user: &str,
    groups: &[&str],
    validity: Duration,
) -> Result<CertifiedKey> {
    ensure!(!user.is_empty(), "a client certificate needs a user name");
    ensure!(
        groups.len() <= 1,
        "a client certificate carries at most one group here (rcgen keeps one O per subject), \
         {} given",
        groups.len()
    );
    let mut params = leaf_params(user, validity);
    if let Some(group) = groups.first() {
        params
            .distinguished_name
            .push(DnType::OrganizationName, *group);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("generate client key")?;
    let cert = params
        .signed_by(&key, ca)
        .with_context(|| format!("sign client certificate for {user}"))?;
    Ok(CertifiedKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// This host's name, as the kernel has it.
fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_string())
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))
}

fn read_key(path: &Path) -> Result<KeyPair> {
    let pem = read_text(path)?;
    KeyPair::from_pem(&pem).with_context(|| format!("{} is not a PEM private key", path.display()))
}

fn read_pair(dir: &Path, cert_file: &str, key_file: &str) -> Result<CertifiedKey> {
    Ok(CertifiedKey {
        cert_pem: read_text(&dir.join(cert_file))?,
        key_pem: read_text(&dir.join(key_file))?,
    })
}

fn write_pair(dir: &Path, cert_file: &str, key_file: &str, pair: &CertifiedKey) -> Result<()> {
    // Key first: a crash between the two leaves a new key with the old certificate, which the
    // next start reports as a mismatch rather than serving a certificate nobody holds a key for.
    write_atomic(&dir.join(key_file), pair.key_pem.as_bytes(), 0o600)?;
    write_atomic(&dir.join(cert_file), pair.cert_pem.as_bytes(), 0o644)
}

fn parse_cert_pem(path: &Path, pem: &str) -> Result<CertificateDer<'static>> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("{} is not a PEM certificate: {e}", path.display()))
}

fn create_private_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("make {} private", dir.display()))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically with `mode`: a temporary file in the same directory,
/// created with the mode (never readable by others, even for a moment), fsynced, renamed over
/// `path`, then the directory fsynced so the rename survives a crash.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(file_name);
    temporary_name.push(format!(".tmp-{}", std::process::id()));
    let temporary = dir.join(temporary_name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let result = (|| -> Result<()> {
        let mut file = options
            .open(&temporary)
            .with_context(|| format!("create {}", temporary.display()))?;
        // The mode given to open is masked by the umask, and an existing file keeps its own:
        // set it explicitly.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            file.set_permissions(std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("chmod {}", temporary.display()))?;
        }
        file.write_all(bytes)
            .with_context(|| format!("write {}", temporary.display()))?;
        file.sync_all()
            .with_context(|| format!("sync {}", temporary.display()))?;
        std::fs::rename(&temporary, path)
            .with_context(|| format!("rename {} to {}", temporary.display(), path.display()))?;
        if let Ok(dir) = std::fs::File::open(dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
    }

    fn parse(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .expect("pem")
            .to_vec()
    }

    #[test]
    fn first_start_creates_everything_private() {
        let data = tempfile::tempdir().expect("tempdir");
        let dir = data.path().join(PKI_DIR);
        let pki =
            Pki::load_or_create(&dir, &["10.0.0.7".into(), "api.example".into()]).expect("create");
        assert_eq!(mode(&dir), 0o700);
        for file in [CA_KEY_FILE, SERVING_KEY_FILE, ADMIN_KEY_FILE, SA_KEY_FILE] {
            assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
        }
        for file in [
            CA_CERT_FILE,
            SERVING_CERT_FILE,
            ADMIN_CERT_FILE,
            SA_PUBLIC_FILE,
        ] {
            assert_eq!(mode(&dir.join(file)), 0o644, "{file}");
        }

        let ca_der = parse(pki.ca_cert_pem());
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("ca");
        assert!(ca.is_ca());
        let years = (ca.validity().not_after.timestamp() - ca.validity().not_before.timestamp())
            / (365 * 24 * 3600);
        assert_eq!(years, 10);

        let serving_der = parse(&pki.serving().cert_pem);
        let (_, serving) = x509_parser::parse_x509_certificate(&serving_der).expect("serving");
        serving
            .verify_signature(Some(ca.public_key()))
            .expect("signed by CA");
        let mut wanted = ServingNames::defaults();
        wanted.add("10.0.0.7");
        wanted.add("api.example");
        if let Some(host) = hostname() {
            wanted.add(&host);
        }
        let covered = san_names(&serving);
        assert_eq!(wanted.not_covered_by(&covered), Vec::<String>::new());
        assert!(covered.ips.contains(&IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert!(covered.dns.contains("kubernetes.default.svc.cluster.local"));

        let admin_der = parse(&pki.admin().cert_pem);
        let (_, admin) = x509_parser::parse_x509_certificate(&admin_der).expect("admin");
        let subject = admin.subject();
        assert_eq!(
            subject
                .iter_common_name()
                .next()
                .and_then(|c| c.as_str().ok()),
            Some(ADMIN_USER)
        );
        assert_eq!(
            subject
                .iter_organization()
                .next()
                .and_then(|c| c.as_str().ok()),
            Some(ADMIN_GROUP)
        );
        assert!(pki.service_account_key_pkcs8().len() > 32);
    }

    #[test]
    fn later_starts_reuse_the_same_pieces() {
        let data = tempfile::tempdir().expect("tempdir");
        let dir = data.path().join(PKI_DIR);
        let first = Pki::load_or_create(&dir, &[]).expect("create");
        let second = Pki::load_or_create(&dir, &[]).expect("load");
        assert_eq!(first.ca_cert_pem(), second.ca_cert_pem());
        assert_eq!(first.serving().cert_pem, second.serving().cert_pem);
        assert_eq!(first.admin().key_pem, second.admin().key_pem);
        assert_eq!(
            first.service_account_key_pkcs8(),
            second.service_account_key_pkcs8()
        );

        // A new name re-issues only the serving certificate, from the same CA.
        let third = Pki::load_or_create(&dir, &["192.0.2.1".into()]).expect("load");
        assert_eq!(first.ca_cert_pem(), third.ca_cert_pem());
        assert_ne!(first.serving().cert_pem, third.serving().cert_pem);
        assert_eq!(first.admin().cert_pem, third.admin().cert_pem);
        let fourth = Pki::load_or_create(&dir, &[]).expect("load");
        assert_eq!(
            third.serving().cert_pem,
            fourth.serving().cert_pem,
            "old names are kept"
        );
    }

    #[test]
    fn missing_or_corrupt_pieces_are_errors_not_regenerated() {
        let data = tempfile::tempdir().expect("tempdir");
        let dir = data.path().join(PKI_DIR);
        Pki::load_or_create(&dir, &[]).expect("create");
        let ca_before = std::fs::read(dir.join(CA_CERT_FILE)).expect("read");

        std::fs::remove_file(dir.join(SA_KEY_FILE)).expect("remove");
        let err = format!(
            "{:#}",
            Pki::load_or_create(&dir, &[]).err().expect("incomplete")
        );
        assert!(
            err.contains("incomplete PKI") && err.contains(SA_KEY_FILE),
            "{err}"
        );
        assert!(!dir.join(SA_KEY_FILE).exists(), "not regenerated");

        let data = tempfile::tempdir().expect("tempdir");
        let dir2 = data.path().join(PKI_DIR);
        Pki::load_or_create(&dir2, &[]).expect("create");
        std::fs::write(dir2.join(CA_KEY_FILE), "garbage").expect("corrupt");
        let err = format!(
            "{:#}",
            Pki::load_or_create(&dir2, &[]).err().expect("corrupt")
        );
        assert!(err.contains(CA_KEY_FILE), "{err}");

        // A CA key from another PKI does not belong to this CA certificate.
        let data = tempfile::tempdir().expect("tempdir");
        let other = data.path().join("other");
        Pki::load_or_create(&other, &[]).expect("create");
        std::fs::copy(other.join(CA_KEY_FILE), dir2.join(CA_KEY_FILE)).expect("copy");
        let err = format!(
            "{:#}",
            Pki::load_or_create(&dir2, &[]).err().expect("mismatch")
        );
        assert!(
            err.contains(CA_KEY_FILE) && err.contains("does not belong"),
            "{err}"
        );
        assert_eq!(
            std::fs::read(dir.join(CA_CERT_FILE)).expect("read"),
            ca_before
        );
    }

    #[test]
    fn leaf_from_another_ca_is_refused() {
        let data = tempfile::tempdir().expect("tempdir");
        let dir = data.path().join("a");
        let other = data.path().join("b");
        Pki::load_or_create(&dir, &[]).expect("create");
        Pki::load_or_create(&other, &[]).expect("create");
        for file in [ADMIN_CERT_FILE, ADMIN_KEY_FILE] {
            std::fs::copy(other.join(file), dir.join(file)).expect("copy");
        }
        let err = format!(
            "{:#}",
            Pki::load_or_create(&dir, &[]).err().expect("foreign leaf")
        );
        assert!(err.contains("was not signed by the cluster CA"), "{err}");
    }

    #[test]
    fn client_certs_for_restricted_users() {
        let data = tempfile::tempdir().expect("tempdir");
        let pki = Pki::load_or_create(&data.path().join(PKI_DIR), &[]).expect("create");
        let jane = pki
            .issue_client_cert("jane", &["dev"], Duration::from_secs(3600))
            .expect("issue");
        let der = parse(&jane.cert_pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("cert");
        assert_eq!(
            cert.subject()
                .iter_common_name()
                .next()
                .and_then(|c| c.as_str().ok()),
            Some("jane")
        );
        assert_eq!(
            cert.subject()
                .iter_organization()
                .next()
                .and_then(|c| c.as_str().ok()),
            Some("dev")
        );
        let ca_der = parse(pki.ca_cert_pem());
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("ca");
        cert.verify_signature(Some(ca.public_key()))
            .expect("signed by CA");
        let no_groups = pki
            .issue_client_cert("bob", &[], Duration::from_secs(3600))
            .expect("issue");
        let der = parse(&no_groups.cert_pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("cert");
        assert_eq!(cert.subject().iter_organization().count(), 0);
        assert!(
            pki.issue_client_cert("", &[], Duration::from_secs(60))
                .is_err()
        );
    }

    #[test]
    fn atomic_write_replaces_and_sets_mode() {
        let data = tempfile::tempdir().expect("tempdir");
        let path = data.path().join("f");
        write_atomic(&path, b"one", 0o644).expect("write");
        write_atomic(&path, b"two", 0o600).expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        assert_eq!(mode(&path), 0o600);
        let leftovers = std::fs::read_dir(data.path()).expect("ls").count();
        assert_eq!(leftovers, 1, "no temporary files left");
    }
}
