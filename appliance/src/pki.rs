//! The cluster's PKI in `<data-dir>/pki/`: the cluster CA, the apiserver's serving certificate,
//! the admin's client certificate and the service-account signing key pair.
//!
//! File names follow kubeadm's (`ca.crt`, `apiserver.crt`, `sa.key`, ...). The first start of
//! `skerry server` creates every piece; later starts load them. This module is the layout and
//! the policy; the certificates, keys and files are `skerry_tls::pki`'s (ECDSA P-256, keys 0600
//! in a 0700 directory, every file written atomically).
//!
//! Invariants: the CA and the service-account key are never regenerated over existing files — a
//! new CA would orphan every issued certificate and a new key every issued token; a PKI
//! directory with some pieces missing, or a piece that does not parse, does not match its key or
//! was not signed by the CA, is an error that names the file. The two leaf certificates are
//! re-issued from the existing CA (with fresh keys) only when they are about to expire, or, for
//! the serving certificate, when it does not cover a name the server is now asked to answer to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rustls_pki_types::CertificateDer;
use skerry_tls::pki::{
    Ca, KeyPair, Names, PRIVATE_FILE_MODE, PUBLIC_FILE_MODE, create_private_dir, generate_key,
    read_key_pair, read_text,
};
pub use skerry_tls::pki::{CertifiedKey, LEAF_VALIDITY, write_atomic};

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

/// The loaded PKI.
pub struct Pki {
    dir: PathBuf,
    ca: Ca,
    serving: CertifiedKey,
    admin: CertifiedKey,
    service_account_key: KeyPair,
}

impl Pki {
    /// Loads the PKI in `dir`, creating it if the directory holds none of it. `names` are the
    /// extra DNS names and IP addresses (as text) the serving certificate must cover, besides
    /// [`SERVING_DNS_NAMES`], [`SERVING_IPS`] and this host's name.
    pub fn load_or_create(dir: &Path, names: &[String]) -> Result<Pki> {
        let mut wanted = serving_defaults();
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

    fn create(dir: &Path, wanted: &Names) -> Result<Pki> {
        create_private_dir(dir)?;
        let ca = Ca::generate(CA_COMMON_NAME)?;
        ca.save(&dir.join(CA_CERT_FILE), &dir.join(CA_KEY_FILE))?;

        let sa_key = generate_key().context("generate the service-account key")?;
        write_atomic(
            &dir.join(SA_KEY_FILE),
            sa_key.serialize_pem().as_bytes(),
            PRIVATE_FILE_MODE,
        )?;
        write_atomic(
            &dir.join(SA_PUBLIC_FILE),
            sa_key.public_key_pem().as_bytes(),
            PUBLIC_FILE_MODE,
        )?;

        let serving = ca.serving_cert(SERVING_COMMON_NAME, wanted)?;
        serving.write(&dir.join(SERVING_CERT_FILE), &dir.join(SERVING_KEY_FILE))?;
        let admin = ca.client_cert(ADMIN_USER, &[ADMIN_GROUP])?;
        admin.write(&dir.join(ADMIN_CERT_FILE), &dir.join(ADMIN_KEY_FILE))?;
        tracing::info!(dir = %dir.display(), "created cluster PKI");
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca,
            serving,
            admin,
            service_account_key: sa_key,
        })
    }

    fn load(dir: &Path, wanted: &Names) -> Result<Pki> {
        let ca = Ca::load(&dir.join(CA_CERT_FILE), &dir.join(CA_KEY_FILE))?;

        let sa_key = read_key_pair(&dir.join(SA_KEY_FILE))?;
        let sa_public = read_text(&dir.join(SA_PUBLIC_FILE))?;
        ensure!(
            sa_public.trim() == sa_key.public_key_pem().trim(),
            "{} does not belong to {}",
            dir.join(SA_PUBLIC_FILE).display(),
            dir.join(SA_KEY_FILE).display()
        );

        let (cert, key) = (dir.join(SERVING_CERT_FILE), dir.join(SERVING_KEY_FILE));
        let mut serving = CertifiedKey::read(&cert, &key)?;
        let serving_state = ca.verify_leaf(&serving, &cert.display().to_string())?;
        let expiring = serving_state.expires_within(LEAF_RENEW_BEFORE);
        let uncovered = wanted.not_covered_by(&serving_state.names);
        if expiring || !uncovered.is_empty() {
            tracing::info!(
                expiring,
                uncovered = ?uncovered,
                "re-issuing the apiserver serving certificate"
            );
            let mut names = wanted.clone();
            // Keep answering to every name the old certificate covered.
            names.extend(&serving_state.names);
            serving = ca.serving_cert(SERVING_COMMON_NAME, &names)?;
            serving.write(&cert, &key)?;
        }
        let (cert, key) = (dir.join(ADMIN_CERT_FILE), dir.join(ADMIN_KEY_FILE));
        let mut admin = CertifiedKey::read(&cert, &key)?;
        if ca
            .verify_leaf(&admin, &cert.display().to_string())?
            .expires_within(LEAF_RENEW_BEFORE)
        {
            tracing::info!("re-issuing the admin client certificate");
            admin = ca.client_cert(ADMIN_USER, &[ADMIN_GROUP])?;
            admin.write(&cert, &key)?;
        }
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca,
            serving,
            admin,
            service_account_key: sa_key,
        })
    }

    /// Issues a client certificate for `user` in `groups` (CN and O, as Kubernetes reads
    /// them), valid for `validity`, with a fresh key; at most
    /// [`skerry_tls::pki::GROUPS_MAX`] groups.
    pub fn issue_client_cert(
        &self,
        user: &str,
        groups: &[&str],
        validity: Duration,
    ) -> Result<CertifiedKey> {
        Ok(self.ca.client_cert_for(user, groups, validity)?)
    }

    /// Issues node `node`'s kubelet serving certificate for its name and `ips`
    /// (`CN=system:node:<node>`, `O=system:nodes`), with a fresh key.
    pub fn issue_node_serving_cert(&self, node: &str, ips: &[IpAddr]) -> Result<CertifiedKey> {
        Ok(self.ca.node_serving_cert(node, ips)?)
    }

    /// The PKI directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster CA certificate, PEM.
    pub fn ca_cert_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The cluster CA certificate, DER (the trust anchor for client certificates).
    pub fn ca_cert_der(&self) -> &CertificateDer<'static> {
        self.ca.cert_der()
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

/// The names every serving certificate covers: [`SERVING_DNS_NAMES`] and [`SERVING_IPS`].
fn serving_defaults() -> Names {
    let mut names = Names::of(SERVING_DNS_NAMES);
    names.ips.extend(SERVING_IPS);
    names
}

/// This host's name, as the kernel has it.
fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use skerry_tls::pki::{CertInfo, inspect_pem};

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
    }

    fn parse(pem: &str) -> CertInfo {
        inspect_pem(pem).expect("a certificate")
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

        let ca = parse(pki.ca_cert_pem());
        assert!(ca.is_ca);
        let years = (ca.not_after - ca.not_before) / (365 * 24 * 3600);
        assert_eq!(years, 10);

        let ca_check = Ca::load(&dir.join(CA_CERT_FILE), &dir.join(CA_KEY_FILE)).expect("CA");
        let serving = ca_check
            .verify_leaf(pki.serving(), "serving")
            .expect("signed by CA");
        let mut wanted = serving_defaults();
        wanted.add("10.0.0.7");
        wanted.add("api.example");
        if let Some(host) = hostname() {
            wanted.add(&host);
        }
        let covered = serving.names;
        assert_eq!(wanted.not_covered_by(&covered), Vec::<String>::new());
        assert!(covered.ips.contains(&IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert!(covered.dns.contains("kubernetes.default.svc.cluster.local"));

        let admin = parse(&pki.admin().cert_pem);
        assert_eq!(admin.common_name.as_deref(), Some(ADMIN_USER));
        assert_eq!(admin.organizations, [ADMIN_GROUP]);
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
        let dir = data.path().join(PKI_DIR);
        let pki = Pki::load_or_create(&dir, &[]).expect("create");
        let jane = pki
            .issue_client_cert("jane", &["dev"], Duration::from_secs(3600))
            .expect("issue");
        let ca = Ca::load(&dir.join(CA_CERT_FILE), &dir.join(CA_KEY_FILE)).expect("CA");
        let cert = ca.verify_leaf(&jane, "jane").expect("signed by CA");
        assert_eq!(cert.common_name.as_deref(), Some("jane"));
        assert_eq!(cert.organizations, ["dev"]);
        let no_groups = pki
            .issue_client_cert("bob", &[], Duration::from_secs(3600))
            .expect("issue");
        assert_eq!(parse(&no_groups.cert_pem).organizations.len(), 0);
        assert!(
            pki.issue_client_cert("", &[], Duration::from_secs(60))
                .is_err()
        );
    }
}
