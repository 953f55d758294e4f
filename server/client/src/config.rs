//! Client configuration: where the apiserver is, how to trust it, who we are, and how fast we
//! may talk — built by hand with [`Config::new`], or read from a kubeconfig the way kubectl
//! and client-go read one ([`Config::from_kubeconfig`], [`Config::infer`]).
//!
//! Of a kubeconfig, the context (`current-context`, or the one named) picks a cluster and a
//! user. From the cluster come `server`, `certificate-authority-data` or
//! `certificate-authority` (a file, relative to the kubeconfig's directory as client-go
//! resolves it) and `insecure-skip-tls-verify`; from the user `client-certificate(-data)` +
//! `client-key(-data)`, or `token` / `tokenFile`. Inline `-data` wins over a file, as in
//! client-go. Exec plugins, auth providers and proxies are not supported and are refused
//! with an error rather than silently ignored, so a kubeconfig that would authenticate
//! differently under kubectl never connects as someone else here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;

use crate::Error;
use crate::flowcontrol::{DEFAULT_BURST, DEFAULT_QPS};

/// How the client authenticates.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// None (anonymous).
    None,
    /// A client certificate and key, PEM.
    ClientCert {
        /// Certificate chain, PEM.
        cert_pem: String,
        /// Private key, PEM.
        key_pem: String,
    },
    /// `Authorization: Bearer <token>`.
    Token(String),
}

/// What the client sends bodies and asks answers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ContentType {
    /// `application/json`
    #[default]
    Json,
    /// `application/vnd.kubernetes.protobuf` (watches as `;stream=watch`).
    Protobuf,
}

/// A client configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// `https://host:port` (or `http://` for tests).
    pub server: String,
    /// The cluster CA, PEM; `None` trusts nothing but what `insecure` allows.
    pub ca_pem: Option<String>,
    /// Skip server certificate verification (`insecure-skip-tls-verify`).
    pub insecure: bool,
    /// Who we are.
    pub credentials: Credentials,
    /// Requests a second (client-go's QPS); 0 is unlimited.
    pub qps: f64,
    /// Requests at once before the QPS applies.
    pub burst: u32,
    /// Body encoding.
    pub content_type: ContentType,
    /// Bound on one request that is not a watch.
    pub timeout: Duration,
    /// `User-Agent`.
    pub user_agent: String,
}

/// client-go's default request timeout is none; skerry bounds non-watch requests so a lost
/// connection cannot stall a controller forever.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The environment variable naming kubeconfig files (`:`-separated, as kubectl reads it).
pub const KUBECONFIG_ENV: &str = "KUBECONFIG";

/// Bound on a kubeconfig, and on a file it names (CA, certificate, key, token). Real ones are
/// a few KiB; the bound stops a path mistakenly pointing at a huge file from being read whole.
/// Semi-arbitrary, generous for a kubeconfig listing hundreds of clusters.
pub const KUBECONFIG_BYTES_MAX: u64 = 16 * 1024 * 1024;

impl Config {
    /// A configuration for `server` with client-go's defaults and no credentials.
    pub fn new(server: &str) -> Config {
        Config {
            server: server.trim_end_matches('/').to_string(),
            ca_pem: None,
            insecure: false,
            credentials: Credentials::None,
            qps: DEFAULT_QPS,
            burst: DEFAULT_BURST,
            content_type: ContentType::Json,
            timeout: DEFAULT_TIMEOUT,
            user_agent: "skerry-client".to_string(),
        }
    }

    /// The configuration of the current context of the kubeconfig at `path`. Relative file
    /// references inside it are resolved against the kubeconfig's directory.
    pub fn from_kubeconfig(path: &Path) -> Result<Config, Error> {
        let text = read_bounded(path, "kubeconfig").map_err(Error::Config)?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        parse_kubeconfig(&text, None, &base)
            .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))
    }

    /// The configuration of `context` (`None`: `current-context`) of a kubeconfig given as
    /// YAML text. Relative file references are resolved against the working directory.
    pub fn from_kubeconfig_str(yaml: &str, context: Option<&str>) -> Result<Config, Error> {
        parse_kubeconfig(yaml, context, Path::new("."))
            .map_err(|e| Error::Config(format!("kubeconfig: {e}")))
    }

    /// kubectl's choice of kubeconfig: the first path in `$KUBECONFIG`, else
    /// `~/.kube/config`. (kubectl merges every file in `$KUBECONFIG`; skerry reads the first,
    /// which is where kubectl takes `current-context` from when it is set there.)
    pub fn infer() -> Result<Config, Error> {
        let from_env = std::env::var_os(KUBECONFIG_ENV)
            .and_then(|paths| std::env::split_paths(&paths).find(|p| !p.as_os_str().is_empty()));
        let path = match from_env {
            Some(path) => path,
            None => {
                let home = std::env::var_os("HOME")
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "no kubeconfig: ${KUBECONFIG_ENV} is not set and neither is $HOME"
                        ))
                    })?;
                PathBuf::from(home).join(".kube").join("config")
            }
        };
        Config::from_kubeconfig(&path)
    }
}

/// A kubeconfig, as much of it as a client needs. Unknown keys are ignored, as client-go
/// ignores them (kubeconfigs carry `preferences`, `extensions`, ...).
#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<NamedUser>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(default)]
    current_context: Option<String>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "context")]
    value: T,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: User,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: Option<String>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
    proxy_url: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct Context {
    cluster: String,
    user: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct User {
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    username: Option<String>,
    exec: Option<serde_yaml_ng::Value>,
    auth_provider: Option<serde_yaml_ng::Value>,
}

fn parse_kubeconfig(yaml: &str, context: Option<&str>, base: &Path) -> Result<Config, String> {
    let kubeconfig: Kubeconfig =
        serde_yaml_ng::from_str(yaml).map_err(|e| format!("not a kubeconfig: {e}"))?;
    let context_name = match context {
        Some(c) => c.to_string(),
        None => kubeconfig
            .current_context
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or("no current-context set, and no context named")?,
    };
    let ctx = &kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .ok_or_else(|| format!("context {context_name:?} not found"))?
        .value;
    let cluster = &kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .ok_or_else(|| {
            format!(
                "cluster {:?} of context {context_name:?} not found",
                ctx.cluster
            )
        })?
        .value;
    let server = cluster
        .server
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("cluster {:?} has no server", ctx.cluster))?;
    if cluster.proxy_url.is_some() {
        return Err(format!(
            "cluster {:?}: proxy-url is not supported",
            ctx.cluster
        ));
    }
    let mut config = Config::new(server);
    config.insecure = cluster.insecure_skip_tls_verify;
    config.ca_pem = pem_of(
        cluster.certificate_authority_data.as_deref(),
        cluster.certificate_authority.as_deref(),
        base,
        "certificate-authority",
    )?;

    let user = match ctx.user.as_deref().filter(|u| !u.is_empty()) {
        None => None,
        Some(name) => Some(
            &kubeconfig
                .users
                .iter()
                .find(|u| u.name == name)
                .ok_or_else(|| format!("user {name:?} of context {context_name:?} not found"))?
                .user,
        ),
    };
    if let Some(user) = user {
        config.credentials = credentials(user, base)?;
    }
    Ok(config)
}

/// The credentials of a kubeconfig user.
fn credentials(user: &User, base: &Path) -> Result<Credentials, String> {
    if user.exec.is_some() {
        return Err("exec credential plugins are not supported".to_string());
    }
    if user.auth_provider.is_some() {
        return Err("auth-provider plugins are not supported".to_string());
    }
    if user.username.is_some() {
        return Err("basic authentication (username/password) is not supported".to_string());
    }
    let cert = pem_of(
        user.client_certificate_data.as_deref(),
        user.client_certificate.as_deref(),
        base,
        "client-certificate",
    )?;
    let key = pem_of(
        user.client_key_data.as_deref(),
        user.client_key.as_deref(),
        base,
        "client-key",
    )?;
    let token = match (&user.token, &user.token_file) {
        (Some(token), _) if !token.is_empty() => Some(token.clone()),
        (_, Some(file)) if !file.is_empty() => {
            let text =
                read_bounded(&resolve(base, file), "tokenFile").map_err(|e| e.to_string())?;
            Some(text.trim().to_string())
        }
        _ => None,
    };
    match (cert, key, token) {
        (Some(cert_pem), Some(key_pem), _) => Ok(Credentials::ClientCert { cert_pem, key_pem }),
        (Some(_), None, _) => Err("client-certificate given without client-key".to_string()),
        (None, Some(_), _) => Err("client-key given without client-certificate".to_string()),
        (None, None, Some(token)) if !token.is_empty() => Ok(Credentials::Token(token)),
        (None, None, _) => Ok(Credentials::None),
    }
}

/// PEM from inline base64 `data` or from the file at `path` (relative to `base`).
fn pem_of(
    data: Option<&str>,
    path: Option<&str>,
    base: &Path,
    what: &str,
) -> Result<Option<String>, String> {
    if let Some(data) = data.filter(|d| !d.is_empty()) {
        // Base64 in YAML may be folded over lines.
        let compact: String = data.split_whitespace().collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(compact.as_bytes())
            .map_err(|e| format!("{what}-data is not base64: {e}"))?;
        let text = String::from_utf8(bytes).map_err(|_| format!("{what}-data is not PEM text"))?;
        return Ok(Some(text));
    }
    match path.filter(|p| !p.is_empty()) {
        Some(path) => read_bounded(&resolve(base, path), what).map(Some),
        None => Ok(None),
    }
}

/// `path` relative to the kubeconfig's directory, as client-go resolves file references.
fn resolve(base: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    }
}

/// A UTF-8 file of at most [`KUBECONFIG_BYTES_MAX`]; the error names `what` and the path.
fn read_bounded(path: &Path, what: &str) -> Result<String, String> {
    let shown = path.display();
    let size = std::fs::metadata(path)
        .map_err(|e| format!("{what} {shown}: {e}"))?
        .len();
    if size > KUBECONFIG_BYTES_MAX {
        return Err(format!(
            "{what} {shown}: {size} bytes, more than the {KUBECONFIG_BYTES_MAX} allowed"
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{what} {shown}: {e}"))?;
    String::from_utf8(bytes).map_err(|_| format!("{what} {shown}: not UTF-8"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn kubeconfig(user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: a\n\
             clusters:\n\
             - name: c1\n  cluster:\n    server: https://10.0.0.1:6443/\n    certificate-authority-data: {ca}\n\
             - name: c2\n  cluster:\n    server: https://10.0.0.2:6443\n    insecure-skip-tls-verify: true\n\
             contexts:\n\
             - name: a\n  context:\n    cluster: c1\n    user: u\n    namespace: kube-system\n\
             - name: b\n  context:\n    cluster: c2\n    user: u\n\
             users:\n- name: u\n  user:\n{user}\
             preferences: {{}}\n",
            ca = b64("CA PEM"),
        )
    }

    #[test]
    fn current_context_with_inline_data() {
        let user = format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64("CERT"),
            b64("KEY")
        );
        let config = Config::from_kubeconfig_str(&kubeconfig(&user), None).unwrap();
        assert_eq!(config.server, "https://10.0.0.1:6443");
        assert_eq!(config.ca_pem.as_deref(), Some("CA PEM"));
        assert!(!config.insecure);
        assert!(matches!(
            config.credentials,
            Credentials::ClientCert { ref cert_pem, ref key_pem } if cert_pem == "CERT" && key_pem == "KEY"
        ));
        let other = Config::from_kubeconfig_str(&kubeconfig(&user), Some("b")).unwrap();
        assert_eq!(other.server, "https://10.0.0.2:6443");
        assert!(other.insecure);
        assert!(other.ca_pem.is_none());
    }

    #[test]
    fn files_resolve_against_the_kubeconfig_directory() {
        let dir = std::env::temp_dir().join(format!("skerry-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pki")).unwrap();
        std::fs::write(dir.join("pki/ca.crt"), "CA FROM FILE").unwrap();
        std::fs::write(dir.join("token"), "  secret-token\n").unwrap();
        let yaml = "current-context: x\n\
            clusters:\n- name: c\n  cluster:\n    server: https://h:1\n    certificate-authority: pki/ca.crt\n\
            contexts:\n- name: x\n  context:\n    cluster: c\n    user: t\n\
            users:\n- name: t\n  user:\n    tokenFile: token\n";
        std::fs::write(dir.join("config"), yaml).unwrap();
        let config = Config::from_kubeconfig(&dir.join("config")).unwrap();
        assert_eq!(config.ca_pem.as_deref(), Some("CA FROM FILE"));
        assert!(matches!(config.credentials, Credentials::Token(ref t) if t == "secret-token"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn inline_token() {
        let config = Config::from_kubeconfig_str(&kubeconfig("    token: abc\n"), None).unwrap();
        assert!(matches!(config.credentials, Credentials::Token(ref t) if t == "abc"));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let message = |yaml: &str, ctx: Option<&str>| match Config::from_kubeconfig_str(yaml, ctx) {
            Err(Error::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        };
        assert!(
            message(&kubeconfig("    token: t\n"), Some("nope")).contains("\"nope\" not found")
        );
        assert!(message("clusters: []\n", None).contains("no current-context"));
        assert!(message("[not, a, map]", None).contains("not a kubeconfig"));
        let exec = "    exec:\n      command: aws\n";
        assert!(message(&kubeconfig(exec), None).contains("exec credential plugins"));
        let half = format!("    client-certificate-data: {}\n", b64("CERT"));
        assert!(message(&kubeconfig(&half), None).contains("without client-key"));
        let bad = "    client-certificate-data: '!!!'\n    client-key-data: '!!!'\n";
        assert!(message(&kubeconfig(bad), None).contains("not base64"));
        let missing = Config::from_kubeconfig(Path::new("/nonexistent/skerry/kubeconfig"));
        assert!(
            matches!(missing, Err(Error::Config(ref m)) if m.contains("/nonexistent/skerry/kubeconfig")),
            "{missing:?}"
        );
    }
}
