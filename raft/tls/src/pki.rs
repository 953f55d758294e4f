//! The cluster's certificates: a CA, the leaves it issues, and the PEM files they live in.
//!
//! Keys are ECDSA P-256 (rcgen with ring), one fresh key per certificate (rcgen derives the
//! serial number from the public key, so serials never repeat). A CA lives ten years and a
//! leaf one, both valid from five minutes before issue, so a member whose clock is a little
//! behind the issuer's takes them at once (kubeadm's numbers: `CertificateValidity`,
//! `CertificateBackdate` in `cmd/kubeadm/app/constants/constants.go`).
//!
//! A leaf is a server's ([`Usage::Server`]: serverAuth, with the DNS names and IP addresses it
//! answers to), a client's ([`Usage::Client`]: clientAuth; Kubernetes reads the subject's CN
//! as the user and each O as a group, `staging/src/k8s.io/apiserver/pkg/authentication/
//! request/x509/x509.go`, `CommonNameUserConversion`) or both (a cluster member on the peer
//! port). The two certificates the node agents need are one call each:
//! [`Ca::node_serving_cert`] (the kubelet's serving certificate, subject and names as the
//! kubelet asks for it) and [`Ca::client_cert`] (a user in groups).
//!
//! The trick for groups: rcgen keeps one value per subject attribute type (rustls/rcgen issue
//! 418), so a second O is written under its OID (2.5.4.10) spelled as a custom attribute
//! type; the certificate then carries two O attributes, which every parser reads as two
//! groups. A third is refused with an error rather than silently dropped.
//!
//! Files: keys are written 0600 in 0700 directories, certificates 0644, each atomically
//! (temporary file created with the mode, fsync, rename, fsync of the directory), so a crash
//! leaves the old file or the new one, never half of one, and a key is never readable by
//! others, not even for a moment.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

pub use rcgen::KeyPair;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData as _, SanType,
};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use time::OffsetDateTime;
use x509_parser::extensions::GeneralName;

use crate::Error;
use crate::config::{certs_from_pem, key_from_pem};

/// Lifetime of a CA: ten years, as kubeadm's and client-go's `NewSelfSignedCACert`
/// (`staging/src/k8s.io/client-go/util/cert/cert.go`).
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Lifetime of a leaf certificate: one year, kubeadm's `CertificateValidity`.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back `notBefore` is set, so members whose clocks are a little behind the one that
/// issued a certificate accept it at once (kubeadm's `CertificateBackdate`, five minutes).
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// The most groups (O attributes) a client certificate carries here: rcgen's one per
/// attribute type, plus one under the OID spelled as a custom type (see the module docs).
pub const GROUPS_MAX: usize = 2;
/// The group of every node's identity (Kubernetes' `user.NodesGroup`).
pub const NODES_GROUP: &str = "system:nodes";
/// The prefix of a node's user name, `system:node:<node name>` (the Node authorizer's
/// `NodeUserNamePrefix`, `plugin/pkg/auth/authorizer/node`).
pub const NODE_USER_PREFIX: &str = "system:node:";
/// Mode of a directory of keys: its owner only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of a private key file.
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// Mode of a certificate or public key file: readable by all, as kubeadm writes them.
pub const PUBLIC_FILE_MODE: u32 = 0o644;

/// What a leaf certificate may be used for (its extended key usage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A TLS server (serverAuth).
    Server,
    /// A TLS client (clientAuth).
    Client,
    /// Both, as a cluster member dials and is dialled on the peer port.
    Both,
}

/// The DNS names and IP addresses a certificate is valid for (its subjectAltName).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    pub dns: BTreeSet<String>,
    pub ips: BTreeSet<IpAddr>,
}

impl Names {
    /// The names in `names`, each an IP address if it parses as one, else a DNS name.
    pub fn of<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Names {
        let mut all = Names::default();
        for name in names {
            all.add(name.as_ref());
        }
        all
    }

    /// Adds a DNS name (lower-cased) or, if it parses as one, an IP address.
    pub fn add(&mut self, name: &str) {
        match name.parse::<IpAddr>() {
            Ok(ip) => {
                self.ips.insert(ip);
            }
            Err(_) => {
                self.dns.insert(name.to_ascii_lowercase());
            }
        }
    }

    /// Adds every name of `other`.
    pub fn extend(&mut self, other: &Names) {
        self.dns.extend(other.dns.iter().cloned());
        self.ips.extend(other.ips.iter().copied());
    }

    /// The names of `self` that `covered` lacks, as text.
    pub fn not_covered_by(&self, covered: &Names) -> Vec<String> {
        let dns = self.dns.difference(&covered.dns).cloned();
        let ips = self.ips.difference(&covered.ips).map(IpAddr::to_string);
        dns.chain(ips).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.dns.is_empty() && self.ips.is_empty()
    }

    fn san_types(&self) -> Result<Vec<SanType>, Error> {
        let mut sans = Vec::new();
        for name in &self.dns {
            let dns = name.as_str().try_into().map_err(|_| {
                Error::Invalid(format!(
                    "{name:?} is not a DNS name a certificate can carry"
                ))
            })?;
            sans.push(SanType::DnsName(dns));
        }
        sans.extend(self.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        Ok(sans)
    }
}

/// What to issue: a leaf's subject, names, usage and lifetime.
#[derive(Clone, Debug)]
pub struct LeafSpec {
    common_name: String,
    organizations: Vec<String>,
    names: Names,
    usage: Usage,
    validity: Duration,
}

impl LeafSpec {
    /// A leaf named `common_name` (an empty one leaves the CN out) for `usage`, with no names
    /// or groups yet, valid for [`LEAF_VALIDITY`].
    pub fn new(common_name: impl Into<String>, usage: Usage) -> LeafSpec {
        LeafSpec {
            common_name: common_name.into(),
            organizations: Vec::new(),
            names: Names::default(),
            usage,
            validity: LEAF_VALIDITY,
        }
    }

    /// The subject's O attributes (a client's groups), at most [`GROUPS_MAX`].
    pub fn organizations<S: AsRef<str>>(mut self, organizations: &[S]) -> LeafSpec {
        self.organizations = organizations
            .iter()
            .map(|o| o.as_ref().to_string())
            .collect();
        self
    }

    /// The DNS names and IP addresses the certificate is valid for.
    pub fn names(mut self, names: Names) -> LeafSpec {
        self.names = names;
        self
    }

    /// How long the certificate is valid from now (it is valid from [`BACKDATE`] ago).
    pub fn validity(mut self, validity: Duration) -> LeafSpec {
        self.validity = validity;
        self
    }
}

/// A certificate and its private key, both PEM (the key PKCS#8).
#[derive(Clone)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertifiedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("CertifiedKey")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl CertifiedKey {
    /// The certificate chain, DER, leaf first.
    pub fn cert_chain(&self) -> Result<Vec<CertificateDer<'static>>, Error> {
        let chain = certs_from_pem(self.cert_pem.as_bytes())
            .map_err(|e| Error::Invalid(format!("the certificate PEM: {e}")))?;
        if chain.is_empty() {
            return Err(Error::Invalid(
                "the certificate PEM: no PEM certificate in it".into(),
            ));
        }
        Ok(chain)
    }

    /// The private key, DER.
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, Error> {
        key_from_pem(self.key_pem.as_bytes())
            .map_err(|e| Error::Invalid(format!("the private key PEM: {e}")))
    }

    /// Reads a pair from two PEM files (not checked: see [`Ca::verify_leaf`]).
    pub fn read(cert: &Path, key: &Path) -> Result<CertifiedKey, Error> {
        Ok(CertifiedKey {
            cert_pem: read_text(cert)?,
            key_pem: read_text(key)?,
        })
    }

    /// Writes the pair: the key first, [`PRIVATE_FILE_MODE`], then the certificate,
    /// [`PUBLIC_FILE_MODE`]. A crash between the two leaves a new key with the old
    /// certificate, which [`Ca::verify_leaf`] reports as a mismatch, rather than a certificate
    /// nobody holds the key of.
    pub fn write(&self, cert: &Path, key: &Path) -> Result<(), Error> {
        write_atomic(key, self.key_pem.as_bytes(), PRIVATE_FILE_MODE)?;
        write_atomic(cert, self.cert_pem.as_bytes(), PUBLIC_FILE_MODE)
    }
}

/// A certificate authority: its certificate and the key that signs with it.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// A new CA named `common_name` (give each its own: OpenSSL, and so curl, takes a leaf
    /// whose issuer name equals its subject name for a self-signed certificate), valid for
    /// [`CA_VALIDITY`].
    pub fn generate(common_name: &str) -> Result<Ca, Error> {
        let key = generate_key()?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_VALIDITY;
        let cert = params
            .self_signed(&key)
            .map_err(Error::issue(format!("self-sign the CA {common_name}")))?;
        Ok(Ca {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA in two PEM texts; errors call them "the CA certificate" and "the CA key".
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, Error> {
        Ca::from_pem_named(cert_pem, key_pem, "the CA certificate", "the CA key")
    }

    /// The CA in two PEM files; errors name the files.
    pub fn load(cert: &Path, key: &Path) -> Result<Ca, Error> {
        Ca::from_pem_named(
            &read_text(cert)?,
            &read_text(key)?,
            &cert.display().to_string(),
            &key.display().to_string(),
        )
    }

    /// Checks that `cert_pem` is a CA certificate, unexpired, whose public key is that of
    /// `key_pem`.
    fn from_pem_named(
        cert_pem: &str,
        key_pem: &str,
        cert_what: &str,
        key_what: &str,
    ) -> Result<Ca, Error> {
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| Error::Invalid(format!("{cert_what} is not a PEM certificate: {e}")))?;
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| Error::Invalid(format!("{key_what} is not a PEM private key: {e}")))?;
        {
            let (_, cert) = x509_parser::parse_x509_certificate(&cert_der)
                .map_err(|e| Error::Invalid(format!("{cert_what}: {e}")))?;
            if !cert.is_ca() {
                return Err(Error::Invalid(format!(
                    "{cert_what} is not a CA certificate"
                )));
            }
            if cert.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
                return Err(Error::Invalid(format!(
                    "{key_what} does not belong to {cert_what}"
                )));
            }
            if cert.validity().time_to_expiration().is_none() {
                return Err(Error::Invalid(format!(
                    "the cluster CA {cert_what} expired on {}",
                    cert.validity().not_after
                )));
            }
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(Error::issue(format!("read {cert_what} as an issuer")))?;
        Ok(Ca {
            issuer,
            cert_pem: cert_pem.to_string(),
            cert_der,
            key_pem: key_pem.to_string(),
        })
    }

    /// Writes the CA: its key ([`PRIVATE_FILE_MODE`]) first, then its certificate.
    pub fn save(&self, cert: &Path, key: &Path) -> Result<(), Error> {
        write_atomic(key, self.key_pem.as_bytes(), PRIVATE_FILE_MODE)?;
        write_atomic(cert, self.cert_pem.as_bytes(), PUBLIC_FILE_MODE)
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER (a trust anchor).
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// A root store holding this CA alone.
    pub fn roots(&self) -> Result<RootCertStore, Error> {
        Ok(crate::config::roots([self.cert_der.clone()])?)
    }

    /// Issues a leaf as `spec` says, with a fresh key.
    pub fn issue(&self, spec: &LeafSpec) -> Result<CertifiedKey, Error> {
        let name = &spec.common_name;
        if spec.organizations.len() > GROUPS_MAX {
            return Err(Error::Invalid(format!(
                "a certificate for {name} carries at most {GROUPS_MAX} groups (O attributes), \
                 {} given",
                spec.organizations.len()
            )));
        }
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        if !name.is_empty() {
            params.distinguished_name.push(DnType::CommonName, name);
        }
        for (index, organization) in spec.organizations.iter().enumerate() {
            let kind = match index {
                0 => DnType::OrganizationName,
                // organizationName's OID as a custom type: a second O (module docs).
                _ => DnType::CustomDnType(vec![2, 5, 4, 10]),
            };
            params.distinguished_name.push(kind, organization.as_str());
        }
        params.subject_alt_names = spec.names.san_types()?;
        params.not_before = now - BACKDATE;
        params.not_after = now + spec.validity;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match spec.usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::Both => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        params.use_authority_key_identifier_extension = true;
        let key = generate_key()?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(Error::issue(format!("sign a certificate for {name}")))?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A serving certificate named `common_name` for `names`, valid for [`LEAF_VALIDITY`].
    pub fn serving_cert(&self, common_name: &str, names: &Names) -> Result<CertifiedKey, Error> {
        self.issue(&LeafSpec::new(common_name, Usage::Server).names(names.clone()))
    }

    /// The serving certificate of node `node` answering on `ips`: `CN=system:node:<node>`,
    /// `O=system:nodes`, the node's name and the IPs as its names, as the kubelet's own
    /// certificate request has them (`pkg/kubelet/certificate/kubelet.go`,
    /// `NewKubeletServerCertificateManager`).
    pub fn node_serving_cert(&self, node: &str, ips: &[IpAddr]) -> Result<CertifiedKey, Error> {
        if node.is_empty() {
            return Err(Error::Invalid(
                "a node serving certificate needs a node name".into(),
            ));
        }
        let mut names = Names::of([node]);
        names.ips.extend(ips.iter().copied());
        self.issue(
            &LeafSpec::new(format!("{NODE_USER_PREFIX}{node}"), Usage::Server)
                .organizations(&[NODES_GROUP])
                .names(names),
        )
    }

    /// A client certificate for `user` in `groups` (CN and O, as Kubernetes reads them),
    /// valid for [`LEAF_VALIDITY`]; at most [`GROUPS_MAX`] groups.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<CertifiedKey, Error> {
        self.client_cert_for(user, groups, LEAF_VALIDITY)
    }

    /// [`Ca::client_cert`] valid for `validity`.
    pub fn client_cert_for(
        &self,
        user: &str,
        groups: &[&str],
        validity: Duration,
    ) -> Result<CertifiedKey, Error> {
        if user.is_empty() {
            return Err(Error::Invalid(
                "a client certificate needs a user name".into(),
            ));
        }
        self.issue(
            &LeafSpec::new(user, Usage::Client)
                .organizations(groups)
                .validity(validity),
        )
    }

    /// Checks that `leaf` parses, that its key belongs to its certificate and that this CA
    /// signed it; returns what it says. Errors name the certificate as `what`.
    pub fn verify_leaf(&self, leaf: &CertifiedKey, what: &str) -> Result<CertInfo, Error> {
        let der = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes())
            .map_err(|e| Error::Invalid(format!("{what} is not a PEM certificate: {e}")))?;
        let key = KeyPair::from_pem(&leaf.key_pem)
            .map_err(|e| Error::Invalid(format!("the key of {what}: {e}")))?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| Error::Invalid(format!("{what}: {e}")))?;
        let (_, ca) = x509_parser::parse_x509_certificate(&self.cert_der)
            .map_err(|e| Error::Invalid(format!("the cluster CA: {e}")))?;
        if cert.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
            return Err(Error::Invalid(format!("{what} and its key do not match")));
        }
        cert.verify_signature(Some(ca.public_key()))
            .map_err(|e| Error::Invalid(format!("{what} was not signed by the cluster CA: {e}")))?;
        describe(&cert).map_err(|e| Error::Invalid(format!("{what}: {e}")))
    }
}

/// What a certificate says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// The subject's CommonName (the last, as Go's `pkix.Name` keeps it).
    pub common_name: Option<String>,
    /// The subject's Organization values, in order.
    pub organizations: Vec<String>,
    /// The subjectAltName's DNS names and IP addresses.
    pub names: Names,
    /// A CA certificate (basicConstraints `cA`).
    pub is_ca: bool,
    /// Its extended key usage allows a TLS server.
    pub server_auth: bool,
    /// Its extended key usage allows a TLS client.
    pub client_auth: bool,
    /// `notBefore` and `notAfter`, Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
}

impl CertInfo {
    /// Whether it has expired or expires within `margin` from now.
    pub fn expires_within(&self, margin: Duration) -> bool {
        let now = OffsetDateTime::now_utc().unix_timestamp();
        self.not_after.saturating_sub(now) < i64::try_from(margin.as_secs()).unwrap_or(i64::MAX)
    }
}

/// Reads the first certificate of `pem` back.
pub fn inspect_pem(pem: &str) -> Result<CertInfo, Error> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| Error::Invalid(format!("not a PEM certificate: {e}")))?;
    inspect(&der)
}

/// Reads a DER certificate back.
pub fn inspect(der: &[u8]) -> Result<CertInfo, Error> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| Error::Invalid(format!("not an X.509 certificate: {e}")))?;
    describe(&cert).map_err(Error::Invalid)
}

fn describe(cert: &x509_parser::certificate::X509Certificate<'_>) -> Result<CertInfo, String> {
    let subject = cert.subject();
    let mut common_name = None;
    for cn in subject.iter_common_name() {
        common_name = Some(
            cn.as_str()
                .map_err(|_| "its CN is not a string")?
                .to_string(),
        );
    }
    let organizations = subject
        .iter_organization()
        .map(|o| o.as_str().map(str::to_string))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "an O of it is not a string")?;
    let (server_auth, client_auth) = match cert.extended_key_usage() {
        Ok(Some(eku)) => (eku.value.server_auth, eku.value.client_auth),
        Ok(None) => (false, false),
        Err(e) => return Err(format!("its extended key usage: {e}")),
    };
    Ok(CertInfo {
        common_name,
        organizations,
        names: san_names(cert),
        is_ca: cert.is_ca(),
        server_auth,
        client_auth,
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    })
}

/// The DNS names and IP addresses in a certificate's subjectAltName.
fn san_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> Names {
    let mut names = Names::default();
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

/// A fresh ECDSA P-256 key (a service-account signing key, or a leaf's).
pub fn generate_key() -> Result<KeyPair, Error> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(Error::issue("generate a P-256 key"))
}

/// The PEM private key in `path`; an error names the file.
pub fn read_key_pair(path: &Path) -> Result<KeyPair, Error> {
    let pem = read_text(path)?;
    KeyPair::from_pem(&pem)
        .map_err(|e| Error::Invalid(format!("{} is not a PEM private key: {e}", path.display())))
}

/// The text of `path`; an error names the file.
pub fn read_text(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(Error::io(format!("read {}", path.display())))
}

/// Creates `dir` (and its parents) and makes it [`PRIVATE_DIR_MODE`].
pub fn create_private_dir(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("create {}", dir.display())))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE_DIR_MODE))
            .map_err(Error::io(format!("make {} private", dir.display())))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically with `mode`: a temporary file in the same directory,
/// created with the mode (never readable by others, even for a moment), fsynced, renamed over
/// `path`, then the directory fsynced so the rename survives a crash.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Some(file_name) = path.file_name() else {
        return Err(Error::Invalid(format!("{} names no file", path.display())));
    };
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
    let result = (|| -> Result<(), Error> {
        let mut file = options
            .open(&temporary)
            .map_err(Error::io(format!("create {}", temporary.display())))?;
        // The mode given to open is masked by the umask, and an existing file keeps its own:
        // set it explicitly.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            file.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(Error::io(format!("chmod {}", temporary.display())))?;
        }
        file.write_all(bytes)
            .map_err(Error::io(format!("write {}", temporary.display())))?;
        file.sync_all()
            .map_err(Error::io(format!("sync {}", temporary.display())))?;
        std::fs::rename(&temporary, path).map_err(Error::io(format!(
            "rename {} to {}",
            temporary.display(),
            path.display()
        )))?;
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
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_ca_is_a_ten_year_ca_signing_with_its_own_key() {
        let ca = Ca::generate("skerry-test-ca").unwrap();
        let info = inspect(ca.cert_der()).unwrap();
        assert!(info.is_ca);
        assert_eq!(info.common_name.as_deref(), Some("skerry-test-ca"));
        assert_eq!(
            (info.not_after - info.not_before) as u64,
            (CA_VALIDITY + BACKDATE).as_secs()
        );
        assert!(!info.expires_within(Duration::from_secs(9 * 365 * 24 * 3600)));
    }

    #[test]
    fn a_serving_certificate_carries_its_names_and_server_usage_only() {
        let ca = Ca::generate("cluster").unwrap();
        let names = Names::of(["API.example", "localhost", "10.0.0.7", "::1"]);
        let leaf = ca.serving_cert("kube-apiserver", &names).unwrap();
        let info = ca.verify_leaf(&leaf, "apiserver.crt").unwrap();
        assert_eq!(info.common_name.as_deref(), Some("kube-apiserver"));
        assert!(info.server_auth && !info.client_auth && !info.is_ca);
        assert_eq!(info.names, names);
        assert!(
            info.names.dns.contains("api.example"),
            "DNS names lower-cased"
        );
        assert!(info.names.ips.contains(&IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(
            (info.not_after - info.not_before) as u64,
            (LEAF_VALIDITY + BACKDATE).as_secs()
        );
        assert!(
            ca.serving_cert("x", &Names::of(["bücher.example"]))
                .unwrap_err()
                .to_string()
                .contains("not a DNS name")
        );
    }

    #[test]
    fn a_node_serving_certificate_is_the_kubelets() {
        let ca = Ca::generate("cluster").unwrap();
        let ips = [
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ];
        let leaf = ca.node_serving_cert("edge-1", &ips).unwrap();
        let info = ca.verify_leaf(&leaf, "kubelet.crt").unwrap();
        assert_eq!(info.common_name.as_deref(), Some("system:node:edge-1"));
        assert_eq!(info.organizations, [NODES_GROUP]);
        assert_eq!(info.names.dns, BTreeSet::from(["edge-1".to_string()]));
        assert_eq!(info.names.ips, BTreeSet::from(ips));
        assert!(info.server_auth && !info.client_auth);
        assert!(ca.node_serving_cert("", &ips).is_err());
    }

    #[test]
    fn a_client_certificate_names_its_user_and_up_to_two_groups() {
        let ca = Ca::generate("cluster").unwrap();
        for groups in [&[][..], &["dev"], &["dev", "system:masters"]] {
            let leaf = ca.client_cert("jane", groups).unwrap();
            let info = ca.verify_leaf(&leaf, "jane.crt").unwrap();
            assert_eq!(info.common_name.as_deref(), Some("jane"));
            assert_eq!(info.organizations, groups);
            assert!(info.client_auth && !info.server_auth);
            assert!(info.names.is_empty());
        }
        let err = ca.client_cert("jane", &["a", "b", "c"]).unwrap_err();
        assert!(err.to_string().contains("at most 2 groups"), "{err}");
        assert!(ca.client_cert("", &[]).is_err());
        let short = ca
            .client_cert_for("bob", &[], Duration::from_secs(3600))
            .unwrap();
        let info = inspect_pem(&short.cert_pem).unwrap();
        assert_eq!(
            (info.not_after - info.not_before) as u64,
            (Duration::from_secs(3600) + BACKDATE).as_secs()
        );
        assert!(info.expires_within(Duration::from_secs(2 * 3600)));
    }

    #[test]
    fn a_member_certificate_serves_and_dials() {
        let ca = Ca::generate("cluster").unwrap();
        let leaf = ca
            .issue(&LeafSpec::new("m1", Usage::Both).names(Names::of(["127.0.0.1"])))
            .unwrap();
        let info = ca.verify_leaf(&leaf, "m1.crt").unwrap();
        assert!(info.server_auth && info.client_auth);
        assert_eq!(
            info.names.ips,
            BTreeSet::from([IpAddr::V4(Ipv4Addr::LOCALHOST)])
        );
    }

    #[test]
    fn a_leaf_from_another_ca_or_with_another_key_is_refused() {
        let ca = Ca::generate("cluster").unwrap();
        let rogue = Ca::generate("rogue").unwrap();
        let foreign = rogue.client_cert("admin", &["system:masters"]).unwrap();
        let err = ca.verify_leaf(&foreign, "admin.crt").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("admin.crt was not signed by the cluster CA"),
            "{err}"
        );
        let mut swapped = ca.client_cert("a", &[]).unwrap();
        swapped.key_pem = ca.client_cert("b", &[]).unwrap().key_pem;
        let err = ca.verify_leaf(&swapped, "a.crt").unwrap_err();
        assert_eq!(err.to_string(), "a.crt and its key do not match");
    }

    #[test]
    fn pem_round_trips_through_files_with_private_modes() {
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join("pki");
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), PRIVATE_DIR_MODE);
        let ca = Ca::generate("cluster").unwrap();
        ca.save(&dir.join("ca.crt"), &dir.join("ca.key")).unwrap();
        assert_eq!(mode(&dir.join("ca.key")), PRIVATE_FILE_MODE);
        assert_eq!(mode(&dir.join("ca.crt")), PUBLIC_FILE_MODE);
        let loaded = Ca::load(&dir.join("ca.crt"), &dir.join("ca.key")).unwrap();
        assert_eq!(loaded.cert_pem(), ca.cert_pem());
        assert_eq!(loaded.cert_der(), ca.cert_der());

        // The loaded CA signs leaves the original's certificate verifies, and back.
        let leaf = loaded.serving_cert("s", &Names::of(["localhost"])).unwrap();
        ca.verify_leaf(&leaf, "s.crt").unwrap();
        leaf.write(&dir.join("s.crt"), &dir.join("s.key")).unwrap();
        assert_eq!(mode(&dir.join("s.key")), PRIVATE_FILE_MODE);
        assert_eq!(mode(&dir.join("s.crt")), PUBLIC_FILE_MODE);
        let read = CertifiedKey::read(&dir.join("s.crt"), &dir.join("s.key")).unwrap();
        assert_eq!(read.cert_pem, leaf.cert_pem);
        assert_eq!(read.key_pem, leaf.key_pem);
        assert_eq!(read.cert_chain().unwrap().len(), 1);
        read.private_key().unwrap();
        let empty = CertifiedKey {
            cert_pem: String::new(),
            key_pem: read.key_pem.clone(),
        };
        assert!(empty.cert_chain().is_err());

        // A key from another CA does not belong; a leaf is not a CA.
        let other = Ca::generate("other").unwrap();
        other.save(&dir.join("o.crt"), &dir.join("o.key")).unwrap();
        let err = Ca::load(&dir.join("ca.crt"), &dir.join("o.key")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} does not belong to {}",
                dir.join("o.key").display(),
                dir.join("ca.crt").display()
            )
        );
        let err = Ca::load(&dir.join("s.crt"), &dir.join("s.key")).unwrap_err();
        assert!(
            err.to_string().ends_with("is not a CA certificate"),
            "{err}"
        );
        let err = Ca::from_pem(ca.cert_pem(), "garbage").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the CA key is not a PEM private key"),
            "{err}"
        );
        let err = Ca::load(&dir.join("missing.crt"), &dir.join("ca.key")).unwrap_err();
        assert!(err.to_string().starts_with("read "), "{err}");

        // A key pair round-trips too.
        let key = generate_key().unwrap();
        write_atomic(&dir.join("k.pem"), key.serialize_pem().as_bytes(), 0o600).unwrap();
        assert_eq!(
            read_key_pair(&dir.join("k.pem")).unwrap().public_key_pem(),
            key.public_key_pem()
        );
    }

    #[test]
    fn atomic_write_replaces_and_sets_mode() {
        let data = tempfile::tempdir().unwrap();
        let path = data.path().join("f");
        write_atomic(&path, b"one", 0o644).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path), 0o600);
        let leftovers = std::fs::read_dir(data.path()).unwrap().count();
        assert_eq!(leftovers, 1, "no temporary files left");
    }
}
