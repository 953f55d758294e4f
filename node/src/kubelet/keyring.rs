//! The credentials of a pod's `imagePullSecrets` (upstream `pkg/credentialprovider/keyring.go`
//! `BasicDockerKeyring` and `secrets/secrets.go` `MakeDockerKeyring`): the docker configs of
//! `kubernetes.io/dockerconfigjson` (`{"auths": {...}}`) and `kubernetes.io/dockercfg` (the
//! bare map) secrets, looked up by the repository an image is pulled from.
//!
//! The rules are upstream's: a key `https://r.example:5000/v1/` is stored as
//! `r.example:5000` (the scheme and a `/v1/` or `/v2/` prefix dropped); a key matches a
//! repository when the ports are equal, the host names have as many dot-separated parts and
//! each part matches as a glob (`*.example.com`), and the key's path is a prefix of the
//! repository's; the keys are tried in reverse lexical order (longer paths first); with no
//! match, a Docker Hub repository gets the credentials of `index.docker.io`.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;

use crate::cri::api;

/// The secret types that carry registry credentials, and their keys.
pub const TYPE_DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
pub const KEY_DOCKER_CONFIG_JSON: &str = ".dockerconfigjson";
pub const TYPE_DOCKERCFG: &str = "kubernetes.io/dockercfg";
pub const KEY_DOCKERCFG: &str = ".dockercfg";

/// Docker Hub's key in docker configs (`keyring.go`: `defaultRegistryHost`).
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// One entry of a docker config (`DockerConfigEntry`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// As CRI's `AuthConfig` (no server address: as the upstream kubelet sends it).
    pub fn auth_config(&self) -> api::AuthConfig {
        api::AuthConfig {
            username: self.username.clone(),
            password: self.password.clone(),
            ..Default::default()
        }
    }
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

#[derive(Deserialize)]
struct RawConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, RawEntry>,
}

/// A keyring: keys (schemeless `host[:port][/path]`) in lookup order and their credentials.
#[derive(Clone, Debug, Default)]
pub struct Keyring {
    entries: BTreeMap<String, Vec<Credentials>>,
}

impl Keyring {
    /// The keyring of `secrets` (in order); secrets of other types are skipped. A secret
    /// whose config cannot be read is an error, as upstream's `MakeDockerKeyring`.
    pub fn from_secrets(secrets: &[Secret]) -> Result<Keyring, String> {
        let mut keyring = Keyring::default();
        for secret in secrets {
            let name = secret.metadata.name.as_deref().unwrap_or_default();
            let data = secret.data.as_ref();
            let (config, key) = match secret.type_.as_deref() {
                Some(TYPE_DOCKER_CONFIG_JSON) => {
                    let Some(bytes) = data.and_then(|d| d.get(KEY_DOCKER_CONFIG_JSON)) else {
                        continue;
                    };
                    let raw: RawConfigJson = serde_json::from_slice(&bytes.0)
                        .map_err(|e| format!("secret {name:?}: {KEY_DOCKER_CONFIG_JSON}: {e}"))?;
                    (raw.auths, KEY_DOCKER_CONFIG_JSON)
                }
                Some(TYPE_DOCKERCFG) => {
                    let Some(bytes) = data.and_then(|d| d.get(KEY_DOCKERCFG)) else {
                        continue;
                    };
                    let raw: BTreeMap<String, RawEntry> = serde_json::from_slice(&bytes.0)
                        .map_err(|e| format!("secret {name:?}: {KEY_DOCKERCFG}: {e}"))?;
                    (raw, KEY_DOCKERCFG)
                }
                _ => continue,
            };
            for (location, entry) in config {
                let creds = entry_credentials(entry)
                    .map_err(|e| format!("secret {name:?}: {key}: {location:?}: {e}"))?;
                keyring.add(&location, creds);
            }
        }
        Ok(keyring)
    }

    /// Adds credentials under a docker config key (`Add`).
    pub fn add(&mut self, location: &str, creds: Credentials) {
        let rest = location
            .strip_prefix("https://")
            .or_else(|| location.strip_prefix("http://"))
            .unwrap_or(location);
        let (host, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let path = path
            .strip_prefix("/v2/")
            .or_else(|| path.strip_prefix("/v1/"))
            .map_or(path.to_string(), |p| format!("/{p}"));
        let key = if path.is_empty() || path == "/" {
            host.to_string()
        } else {
            format!("{host}{path}")
        };
        let list = self.entries.entry(key).or_default();
        if !list.contains(&creds) {
            list.push(creds);
        }
    }

    /// The credentials for `repository` (`r.example:5000/team/app`, no tag), in the order to
    /// try them (`Lookup`).
    pub fn lookup(&self, repository: &str) -> Vec<Credentials> {
        let mut out = Vec::new();
        for (key, creds) in self.entries.iter().rev() {
            if urls_match(key, repository) {
                out.extend(creds.iter().cloned());
            }
        }
        if out.is_empty()
            && is_default_registry_match(repository)
            && let Some(creds) = self.entries.get(DEFAULT_REGISTRY_HOST)
        {
            out.extend(creds.iter().cloned());
        }
        out
    }
}

/// A docker config entry's credentials: `auth` (base64 of `user:password`) wins over
/// `username` / `password` (`DockerConfigEntry.UnmarshalJSON`).
fn entry_credentials(entry: RawEntry) -> Result<Credentials, String> {
    if entry.auth.is_empty() {
        return Ok(Credentials {
            username: entry.username,
            password: entry.password,
        });
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(entry.auth.trim())
        .map_err(|e| format!("auth: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|_| "auth: not UTF-8".to_string())?;
    let (username, password) = text.split_once(':').ok_or_else(|| {
        "auth: unable to parse auth field, must be formatted as base64(username:password)"
            .to_string()
    })?;
    Ok(Credentials {
        username: username.to_string(),
        password: password.to_string(),
    })
}

/// `host[:port][/path]` split into host parts, port and path (`splitURL`).
fn split(url: &str) -> (Vec<&str>, &str, &str) {
    let (authority, path) = match url.find('/') {
        Some(i) => url.split_at(i),
        None => (url, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (h, p),
        _ => (authority, ""),
    };
    (host.split('.').collect(), port, path)
}

/// `URLsMatch`: the glob `key` against the repository `target`.
pub fn urls_match(key: &str, target: &str) -> bool {
    let (glob_parts, glob_port, glob_path) = split(key);
    let (parts, port, path) = split(target);
    glob_port == port
        && glob_parts.len() == parts.len()
        && path.starts_with(glob_path)
        && glob_parts
            .iter()
            .zip(&parts)
            .all(|(g, p)| glob_match(g.as_bytes(), p.as_bytes()))
}

/// Go's `filepath.Match` for one host part: `*` (any run), `?` (one character), the rest
/// literal (ranges are not used in registry host names).
fn glob_match(glob: &[u8], text: &[u8]) -> bool {
    match glob.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob_match(rest, &text[i..])),
        Some((b'?', rest)) => !text.is_empty() && glob_match(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && glob_match(rest, &text[1..]),
    }
}

/// Whether `repository` is on Docker Hub (`isDefaultRegistryMatch`).
fn is_default_registry_match(repository: &str) -> bool {
    let Some((first, _)) = repository.split_once('/') else {
        return !repository.is_empty();
    };
    if first.is_empty() {
        return false;
    }
    first == "docker.io" || first == DEFAULT_REGISTRY_HOST || !first.contains(['.', ':'])
}

/// The repository of a normalized image reference (`docker.io/library/busybox:1` to
/// `docker.io/library/busybox`), as the kubelet's `ParseImageName` gives the keyring.
pub fn repository(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(name, _)| name);
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => &image[..last_slash + i],
        None => image,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn creds(u: &str) -> Credentials {
        Credentials {
            username: u.to_string(),
            password: format!("{u}-pw"),
        }
    }

    fn users(list: &[Credentials]) -> Vec<&str> {
        list.iter().map(|c| c.username.as_str()).collect()
    }

    #[test]
    fn keys_match_as_upstreams_keyring() {
        let mut k = Keyring::default();
        k.add("https://r.example:5000/v1/", creds("port"));
        k.add("*.example.com", creds("glob"));
        k.add("http://r.example/team", creds("team"));
        k.add("r.example", creds("host"));
        k.add("index.docker.io", creds("hub"));
        assert_eq!(users(&k.lookup("r.example:5000/app")), ["port"]);
        assert_eq!(users(&k.lookup("r.example/team/app")), ["team", "host"]);
        assert_eq!(users(&k.lookup("r.example/other/app")), ["host"]);
        assert_eq!(users(&k.lookup("a.example.com/app")), ["glob"]);
        assert!(k.lookup("a.b.example.com/app").is_empty());
        assert!(k.lookup("r.example:5001/app").is_empty());
        assert_eq!(users(&k.lookup("docker.io/library/busybox")), ["hub"]);
        assert_eq!(users(&k.lookup("someone/app")), ["hub"]);
        assert!(k.lookup("quay.io/app").is_empty());
    }

    #[test]
    fn glob_is_filepath_match() {
        assert!(glob_match(b"*", b"anything"));
        assert!(glob_match(b"a?c", b"abc"));
        assert!(!glob_match(b"a?c", b"ac"));
        assert!(glob_match(b"*-mirror", b"eu-mirror"));
        assert!(!glob_match(b"eu", b"eu2"));
    }

    fn secret(name: &str, type_: &str, key: &str, json: &str) -> Secret {
        Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            type_: Some(type_.to_string()),
            data: Some(BTreeMap::from([(
                key.to_string(),
                ByteString(json.as_bytes().to_vec()),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn secrets_of_both_types() {
        let a = secret(
            "a",
            TYPE_DOCKER_CONFIG_JSON,
            KEY_DOCKER_CONFIG_JSON,
            // base64("u:p")
            r#"{"auths":{"r.example:5000":{"auth":"dTpw"}}}"#,
        );
        let b = secret(
            "b",
            TYPE_DOCKERCFG,
            KEY_DOCKERCFG,
            r#"{"https://r.example:5000":{"username":"v","password":"q"}}"#,
        );
        let opaque = secret("c", "Opaque", "x", "not json");
        let k = Keyring::from_secrets(&[a, b, opaque]).expect("keyring");
        let found = k.lookup("r.example:5000/busybox");
        assert_eq!(
            found
                .iter()
                .map(|c| (c.username.as_str(), c.password.as_str()))
                .collect::<Vec<_>>(),
            [("u", "p"), ("v", "q")]
        );
        let bad = secret("bad", TYPE_DOCKERCFG, KEY_DOCKERCFG, "{");
        let e = Keyring::from_secrets(&[bad]).expect_err("bad json");
        assert!(e.starts_with("secret \"bad\": .dockercfg: "), "{e}");
    }

    #[test]
    fn repository_drops_tag_and_digest() {
        assert_eq!(repository("r.example:5000/a/b:1"), "r.example:5000/a/b");
        assert_eq!(repository("r.example:5000/a/b"), "r.example:5000/a/b");
        assert_eq!(
            repository("docker.io/library/busybox@sha256:00"),
            "docker.io/library/busybox"
        );
    }
}
