//! The registries file (k3s's `registries.yaml`: `--private-registry`, by default
//! `<data-dir>/agent/registries.yaml`): mirrors and per-host TLS turned into containerd's
//! registry hosts directory, credentials handed to the kubelet for CRI `PullImage`.
//!
//! The file has k3s's shape:
//!
//! ```yaml
//! mirrors:
//!   docker.io:
//!     endpoint: ["http://127.0.0.1:5000"]
//! configs:
//!   "127.0.0.1:5000":
//!     auth: {username: u, password: p}
//!     tls: {ca_file: /ca.pem, cert_file: /c.pem, key_file: /k.pem, insecure_skip_verify: false}
//! ```
//!
//! The trick it carries: containerd 1.6 reads its `config_path` directory (one
//! `<registry>/hosts.toml` per registry: `server`, `[host."<endpoint>"]` with `capabilities`,
//! `skip_verify`, `ca`, `client`) on every pull, so a changed file needs no restart of
//! containerd: the watcher rewrites the directory and the next pull sees it. `hosts.toml`
//! carries no credentials, so the file's `auth` stays in memory ([`Registries`]) and the
//! kubelet puts it into the `AuthConfig` of `PullImage`, after the pod's `imagePullSecrets`
//! (as the upstream kubelet's keyring puts the pod's secrets before the node's own).
//!
//! Not carried: `rewrite` (k3s patches containerd for it; containerd 1.6's `hosts.toml` has no
//! such field), so a file with rewrites is refused with a clear error rather than pulling
//! other images than the file says.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::containerd::config::toml_string;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cri::api;

/// The file's name under `<data-dir>/agent` (k3s keeps it as `/etc/rancher/k3s/registries.yaml`).
pub const DEFAULT_FILE: &str = "registries.yaml";

/// How often the file is looked at for a change. A changed mirror is used by the pulls that
/// start after at most this long; a stat every 2 s costs nothing (the images folder's period,
/// `images::watch::POLL_INTERVAL`).
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// The largest registries file read: a file of a few hundred registries is a few tens of
/// KiB; anything bigger is a mistake, not a configuration, and is not loaded into memory.
pub const MAX_FILE_SIZE: u64 = 1024 * 1024;

/// The first line of every `hosts.toml` skerry writes: a directory holding it is skerry's to
/// replace or remove; any other is left alone.
const MARKER: &str = "# Written by skerry from its registries file; edits are overwritten.";

/// docker.io's default endpoint (containerd's `docker.DefaultHost` resolves docker.io to
/// `registry-1.docker.io`).
const DOCKER_IO: &str = "docker.io";
const DOCKER_IO_ENDPOINT: &str = "https://registry-1.docker.io";

/// containerd's directory name for the hosts of every registry without its own (k3s's `*`).
const DEFAULT_HOSTS_DIR: &str = "_default";

/// A registries file, parsed and checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistriesFile {
    /// Per registry host (`docker.io`, `my.registry:5000`, `*`): its endpoints, in order.
    pub mirrors: BTreeMap<String, Vec<String>>,
    /// Per host (a registry or an endpoint's host): credentials and TLS.
    pub configs: BTreeMap<String, HostConfig>,
}

/// `configs.<host>`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    #[serde(default)]
    pub auth: Option<Auth>,
    #[serde(default)]
    pub tls: Option<Tls>,
}

/// `configs.<host>.auth` (k3s's field names).
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub password: String,
    /// base64 of `username:password`.
    #[serde(default)]
    pub auth: String,
    #[serde(default)]
    pub identitytoken: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// `configs.<host>.tls`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    mirrors: Option<BTreeMap<String, RawMirror>>,
    #[serde(default)]
    configs: Option<BTreeMap<String, HostConfig>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMirror {
    #[serde(default)]
    endpoint: Vec<String>,
    #[serde(default)]
    rewrite: BTreeMap<String, String>,
}

/// Why a registries file cannot be used; one line naming the file and the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("registries file {file}: {message}")]
pub struct RegistriesError {
    pub file: String,
    pub message: String,
}

/// Parses a registries file's text (`file` names it in errors).
pub fn parse(file: &Path, text: &str) -> Result<RegistriesFile, RegistriesError> {
    let err = |message: String| RegistriesError {
        file: file.display().to_string(),
        message: message.replace('\n', " "),
    };
    if text.trim().is_empty() {
        return Ok(RegistriesFile::default());
    }
    let raw: RawFile = serde_yaml_ng::from_str(text).map_err(|e| err(e.to_string()))?;
    let mut out = RegistriesFile::default();
    for (registry, mirror) in raw.mirrors.unwrap_or_default() {
        check_host(&registry, true).map_err(|m| err(format!("mirrors.{registry:?}: {m}")))?;
        if let Some(pattern) = mirror.rewrite.keys().next() {
            return Err(err(format!(
                "mirrors.{registry:?}.rewrite.{pattern:?}: rewrites are not supported by containerd 1.6's registry hosts"
            )));
        }
        let mut endpoints = Vec::new();
        for (i, endpoint) in mirror.endpoint.iter().enumerate() {
            let url = endpoint_url(endpoint)
                .map_err(|m| err(format!("mirrors.{registry:?}.endpoint[{i}]: {m}")))?;
            endpoints.push(url);
        }
        out.mirrors.insert(registry, endpoints);
    }
    for (host, config) in raw.configs.unwrap_or_default() {
        check_host(&host, false).map_err(|m| err(format!("configs.{host:?}: {m}")))?;
        if let Some(auth) = &config.auth
            && !auth.auth.is_empty()
        {
            decode_auth(&auth.auth).map_err(|m| err(format!("configs.{host:?}.auth.auth: {m}")))?;
        }
        if let Some(tls) = &config.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            return Err(err(format!(
                "configs.{host:?}.tls: cert_file and key_file go together"
            )));
        }
        out.configs.insert(host, config);
    }
    Ok(out)
}

/// A registry or endpoint host as the file names it: `host[:port]` (`*` among mirrors).
fn check_host(host: &str, wildcard: bool) -> Result<(), String> {
    if wildcard && host == "*" {
        return Ok(());
    }
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
        && !host.starts_with(['.', '-', ':']);
    if ok {
        Ok(())
    } else {
        Err("not a registry host (host or host:port)".to_string())
    }
}

/// An endpoint as containerd's `[host."..."]` takes it: `http(s)://host[:port][/path]`; a
/// bare `host[:port]` is `https://` (as k3s reads it).
fn endpoint_url(endpoint: &str) -> Result<String, String> {
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("https://{endpoint}")
    };
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{endpoint:?} is not an http or https URL"))?;
    let host = rest.split('/').next().unwrap_or_default();
    check_host(host, false).map_err(|m| format!("{endpoint:?}: {m}"))?;
    if url
        .bytes()
        .any(|b| b.is_ascii_control() || b == b'"' || b == b'\\' || b == b' ')
    {
        return Err(format!("{endpoint:?} is not a URL"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// The host of an endpoint URL.
fn endpoint_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// `auth`: base64 of `user:password`.
fn decode_auth(auth: &str) -> Result<(String, String), String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|e| format!("not base64: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8 once decoded".to_string())?;
    let (user, password) = text
        .split_once(':')
        .ok_or_else(|| "not base64 of user:password".to_string())?;
    Ok((user.to_string(), password.to_string()))
}

/// Whether `host` (without a port) is a loopback name, for which containerd's CRI plugin
/// speaks plain HTTP by default (`defaultScheme`).
fn is_loopback(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    matches!(name, "localhost" | "127.0.0.1" | "[::1]" | "::1")
}

/// The registry's own endpoint, tried after its mirrors (containerd's `server`).
fn default_endpoint(registry: &str) -> String {
    if registry == DOCKER_IO {
        DOCKER_IO_ENDPOINT.to_string()
    } else if is_loopback(registry) {
        format!("http://{registry}")
    } else {
        format!("https://{registry}")
    }
}

fn tls_lines(out: &mut String, indent: &str, tls: Option<&Tls>) {
    let Some(tls) = tls else { return };
    if tls.insecure_skip_verify {
        let _ = writeln!(out, "{indent}skip_verify = true");
    }
    if let Some(ca) = &tls.ca_file {
        let _ = writeln!(
            out,
            "{indent}ca = {}",
            toml_string(&ca.display().to_string())
        );
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        let _ = writeln!(
            out,
            "{indent}client = [[{}, {}]]",
            toml_string(&cert.display().to_string()),
            toml_string(&key.display().to_string())
        );
    }
}

/// The registry hosts directory the file means: directory name (`<registry>`, `_default`
/// for `*`) to `hosts.toml` text. Every registry with mirrors gets one; so does every
/// `configs` host with TLS settings (for its own endpoint).
pub fn render(file: &RegistriesFile) -> BTreeMap<String, String> {
    let mut registries: BTreeSet<&str> = file.mirrors.keys().map(String::as_str).collect();
    for (host, config) in &file.configs {
        if config.tls.is_some() {
            registries.insert(host);
        }
    }
    let mut out = BTreeMap::new();
    for registry in registries {
        let mut text = String::new();
        let _ = writeln!(text, "{MARKER}");
        let dir = if registry == "*" {
            DEFAULT_HOSTS_DIR.to_string()
        } else {
            let server = default_endpoint(registry);
            let _ = writeln!(text, "server = {}", toml_string(&server));
            tls_lines(
                &mut text,
                "",
                file.configs.get(registry).and_then(|c| c.tls.as_ref()),
            );
            registry.to_string()
        };
        for endpoint in file.mirrors.get(registry).into_iter().flatten() {
            if registry != "*" && *endpoint == default_endpoint(registry) {
                // The registry itself: `server` above already tries it last.
                continue;
            }
            let _ = writeln!(text);
            let _ = writeln!(text, "[host.{}]", toml_string(endpoint));
            let _ = writeln!(text, "  capabilities = [\"pull\", \"resolve\"]");
            tls_lines(
                &mut text,
                "  ",
                file.configs
                    .get(endpoint_host(endpoint))
                    .and_then(|c| c.tls.as_ref()),
            );
        }
        out.insert(dir, text);
    }
    out
}

/// Writes `rendered` into containerd's hosts directory `dir`: each `<name>/hosts.toml`
/// replaced atomically (a temporary file renamed over it), and the directories skerry wrote
/// before (their `hosts.toml` starts with the marker) that are no longer wanted removed.
pub fn apply(dir: &Path, rendered: &BTreeMap<String, String>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in rendered {
        let host_dir = dir.join(name);
        std::fs::create_dir_all(&host_dir)?;
        let path = host_dir.join("hosts.toml");
        if std::fs::read_to_string(&path).is_ok_and(|old| old == *text) {
            continue;
        }
        let tmp = host_dir.join(".hosts.toml.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if rendered.contains_key(&name) {
            continue;
        }
        let hosts = entry.path().join("hosts.toml");
        if std::fs::read_to_string(&hosts).is_ok_and(|t| t.starts_with(MARKER)) {
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

/// The credentials of the registries file, shared with the kubelet; replaced whole when the
/// file changes.
#[derive(Clone, Default)]
pub struct Registries {
    file: Arc<RwLock<Arc<RegistriesFile>>>,
}

impl std::fmt::Debug for Registries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registries").finish_non_exhaustive()
    }
}

impl Registries {
    /// No registry configuration.
    pub fn new() -> Registries {
        Registries::default()
    }

    /// The file now in use.
    pub fn current(&self) -> Arc<RegistriesFile> {
        self.file.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, file: RegistriesFile) {
        *self.file.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(file);
    }

    /// The credentials the file gives a pull of `registry`'s images: the registry's own, then
    /// those of its mirrors' hosts, in endpoint order (each one an `AuthConfig` to try).
    pub fn credentials(&self, registry: &str) -> Vec<api::AuthConfig> {
        let file = self.current();
        let mut hosts = vec![registry.to_string()];
        let mirrors = file
            .mirrors
            .get(registry)
            .or_else(|| file.mirrors.get("*"))
            .into_iter()
            .flatten();
        for endpoint in mirrors {
            let host = endpoint_host(endpoint).to_string();
            if !hosts.contains(&host) {
                hosts.push(host);
            }
        }
        hosts
            .iter()
            .filter_map(|h| file.configs.get(h)?.auth.as_ref())
            .map(auth_config)
            .collect()
    }
}

/// `configs.<host>.auth` as CRI's `AuthConfig` (`auth` decoded into username and password, as
/// the upstream kubelet's `DockerConfigEntry` does; the file was checked when parsed).
fn auth_config(auth: &Auth) -> api::AuthConfig {
    let (username, password) = if auth.auth.is_empty() {
        (auth.username.clone(), auth.password.clone())
    } else {
        decode_auth(&auth.auth).unwrap_or_default()
    };
    api::AuthConfig {
        username,
        password,
        identity_token: auth.identitytoken.clone(),
        ..Default::default()
    }
}

/// Reads and parses the file at `path`: `Ok(None)` when there is none.
pub fn load(path: &Path) -> Result<Option<RegistriesFile>, RegistriesError> {
    let err = |message: String| RegistriesError {
        file: path.display().to_string(),
        message,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e.to_string())),
    };
    if meta.len() > MAX_FILE_SIZE {
        return Err(err(format!(
            "{} bytes, more than the {MAX_FILE_SIZE} read",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    parse(path, &text).map(Some)
}

/// The registries file at `path` kept in force: loaded now and whenever it changes (polled
/// every [`POLL_INTERVAL`]), rendered into `hosts_dir` (containerd's `config_path`, `None`
/// for a runtime skerry does not configure) and its credentials put in `registries`. A file
/// that cannot be used is one error line and no registry configuration until it is fixed.
pub struct Watcher {
    path: PathBuf,
    hosts_dir: Option<PathBuf>,
    registries: Registries,
    /// The (size, mtime) of the file at the last load (`Some(None)`: there was none).
    seen: Option<Option<(u64, SystemTime)>>,
}

impl Watcher {
    pub fn new(path: PathBuf, hosts_dir: Option<PathBuf>, registries: Registries) -> Watcher {
        Watcher {
            path,
            hosts_dir,
            registries,
            seen: None,
        }
    }

    /// Loads the file if it changed since the last look; the error of a file that cannot be
    /// used (the configuration is then empty).
    pub fn reload(&mut self) -> Result<(), RegistriesError> {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
        if self.seen == Some(stamp) {
            return Ok(());
        }
        let first = self.seen.is_none();
        self.seen = Some(stamp);
        let (file, result) = match load(&self.path) {
            Ok(file) => (file.unwrap_or_default(), Ok(())),
            Err(e) => (RegistriesFile::default(), Err(e)),
        };
        if let Some(dir) = &self.hosts_dir
            && let Err(e) = apply(dir, &render(&file))
        {
            warn!(dir = %dir.display(), error = %e, "writing containerd's registry hosts failed");
        }
        if !first || !file.mirrors.is_empty() || !file.configs.is_empty() {
            info!(
                file = %self.path.display(),
                mirrors = file.mirrors.len(),
                configs = file.configs.len(),
                "registries file loaded"
            );
        }
        self.registries.set(file);
        result
    }

    /// Polls until `stop`; errors after the first load are logged.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(POLL_INTERVAL) => {}
                () = stop.cancelled() => return,
            }
            if let Err(e) = self.reload() {
                tracing::error!("{e}; running with no registry configuration");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> RegistriesFile {
        parse(Path::new("/r.yaml"), text).expect("valid file")
    }

    fn parse_err(text: &str) -> String {
        parse(Path::new("/r.yaml"), text)
            .expect_err("invalid file")
            .to_string()
    }

    #[test]
    fn parses_k3s_shape() {
        let file = parse_ok(
            r#"
mirrors:
  docker.io:
    endpoint:
      - "http://127.0.0.1:5000"
      - mirror.example:8443/v2/x
configs:
  "127.0.0.1:5000":
    auth:
      username: u
      password: p
  mirror.example:8443:
    tls:
      ca_file: /ca.pem
      cert_file: /c.pem
      key_file: /k.pem
      insecure_skip_verify: true
"#,
        );
        assert_eq!(
            file.mirrors["docker.io"],
            vec!["http://127.0.0.1:5000", "https://mirror.example:8443/v2/x"]
        );
        assert_eq!(
            file.configs["127.0.0.1:5000"]
                .auth
                .as_ref()
                .map(|a| a.username.as_str()),
            Some("u")
        );
        assert!(
            file.configs["mirror.example:8443"]
                .tls
                .as_ref()
                .is_some_and(|t| t.insecure_skip_verify)
        );
        assert_eq!(parse_ok(""), RegistriesFile::default());
        assert_eq!(
            parse_ok("mirrors: {}\nconfigs:\n"),
            RegistriesFile::default()
        );
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let e = parse_err("mirrors:\n  docker.io:\n    endpoint: http://x\n");
        assert!(e.starts_with("registries file /r.yaml: "), "{e}");
        assert!(e.contains("endpoint"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = parse_err("mirrors:\n  docker.io:\n    endpoints: [\"http://x\"]\n");
        assert!(e.contains("unknown field `endpoints`"), "{e}");
        let e = parse_err("mirrors:\n  docker.io:\n    endpoint: [\"ftp://x\"]\n");
        assert!(
            e.contains(
                "mirrors.\"docker.io\".endpoint[0]: \"ftp://x\" is not an http or https URL"
            ),
            "{e}"
        );
        let e = parse_err("configs:\n  r.io:\n    auth:\n      auth: \"!!!\"\n");
        assert!(e.contains("configs.\"r.io\".auth.auth: not base64"), "{e}");
        let e = parse_err("configs:\n  r.io:\n    tls:\n      cert_file: /c\n");
        assert!(e.contains("cert_file and key_file go together"), "{e}");
        let e = parse_err("mirrors:\n  \"a/b\":\n    endpoint: []\n");
        assert!(e.contains("mirrors.\"a/b\": not a registry host"), "{e}");
        let e = parse_err("mirrors:\n  docker.io:\n    rewrite:\n      \"^a/(.*)\": \"b/$1\"\n");
        assert!(e.contains("rewrite"), "{e}");
        let e = parse_err("- a\n- b\n");
        assert!(e.starts_with("registries file /r.yaml: "), "{e}");
    }

    #[test]
    fn renders_hosts_toml() {
        let file = parse_ok(
            r#"
mirrors:
  docker.io:
    endpoint: ["http://127.0.0.1:5000", "https://registry-1.docker.io"]
  "*":
    endpoint: ["https://all.example"]
configs:
  "127.0.0.1:5000":
    auth: {username: u, password: p}
  private.example:
    tls: {ca_file: /ca.pem, cert_file: /c.pem, key_file: /k.pem}
  all.example:
    tls: {insecure_skip_verify: true}
"#,
        );
        let out = render(&file);
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            ["_default", "all.example", "docker.io", "private.example"]
        );
        assert_eq!(
            out["docker.io"],
            format!(
                "{MARKER}\nserver = \"https://registry-1.docker.io\"\n\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            )
        );
        assert_eq!(
            out["private.example"],
            format!(
                "{MARKER}\nserver = \"https://private.example\"\nca = \"/ca.pem\"\nclient = [[\"/c.pem\", \"/k.pem\"]]\n"
            )
        );
        assert_eq!(
            out["_default"],
            format!(
                "{MARKER}\n\n[host.\"https://all.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
            )
        );
        assert_eq!(default_endpoint("localhost:5000"), "http://localhost:5000");
    }

    #[test]
    fn credentials_follow_the_registry_then_its_mirrors() {
        let registries = Registries::new();
        registries.set(parse_ok(
            r#"
mirrors:
  docker.io:
    endpoint: ["http://127.0.0.1:5000"]
configs:
  "127.0.0.1:5000":
    auth: {auth: "dTpw"}
  docker.io:
    auth: {username: d, password: q}
"#,
        ));
        let creds = registries.credentials("docker.io");
        let users: Vec<_> = creds
            .iter()
            .map(|c| (c.username.as_str(), c.password.as_str()))
            .collect();
        assert_eq!(users, [("d", "q"), ("u", "p")]);
        assert_eq!(registries.credentials("127.0.0.1:5000").len(), 1);
        assert!(registries.credentials("other.example").is_empty());
    }

    #[test]
    fn apply_replaces_only_its_own_directories() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("mine.example")).expect("mkdir");
        std::fs::write(
            dir.path().join("mine.example/hosts.toml"),
            format!("{MARKER}\nserver = \"https://mine.example\"\n"),
        )
        .expect("write");
        std::fs::create_dir_all(dir.path().join("admin.example")).expect("mkdir");
        std::fs::write(
            dir.path().join("admin.example/hosts.toml"),
            "server = \"x\"\n",
        )
        .expect("write");
        let mut want = BTreeMap::new();
        want.insert(
            "new.example".to_string(),
            format!("{MARKER}\nserver = \"y\"\n"),
        );
        apply(dir.path(), &want).expect("apply");
        assert!(!dir.path().join("mine.example").exists());
        assert!(dir.path().join("admin.example/hosts.toml").exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("new.example/hosts.toml")).expect("read"),
            want["new.example"]
        );
    }

    #[test]
    fn watcher_reloads_and_clears_on_a_bad_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("registries.yaml");
        let hosts = dir.path().join("certs.d");
        let registries = Registries::new();
        let mut watcher = Watcher::new(path.clone(), Some(hosts.clone()), registries.clone());
        watcher.reload().expect("no file is no configuration");
        assert!(registries.current().mirrors.is_empty());
        std::fs::write(
            &path,
            "mirrors:\n  r.example:\n    endpoint: [\"http://127.0.0.1:1\"]\n",
        )
        .expect("write");
        watcher.reload().expect("valid");
        assert!(hosts.join("r.example/hosts.toml").exists());
        std::fs::write(&path, "mirrors:\n  r.example:\n    endpoint: 7\n").expect("write");
        let e = watcher.reload().expect_err("invalid");
        assert!(e.to_string().contains("registries.yaml"), "{e}");
        assert!(registries.current().mirrors.is_empty());
        assert!(!hosts.join("r.example").exists());
    }
}
