//! The admin kubeconfig: the file `kubectl` reads to reach skerry as `kubernetes-admin`.
//!
//! It holds one cluster (`skerry`: the server URL and the cluster CA as
//! `certificate-authority-data`), one user (the admin client certificate and key as
//! `client-certificate-data` / `client-key-data`) and one context (`skerry`), which is the
//! `current-context`.
//!
//! The YAML is written by hand rather than with a YAML library: `serde_yaml` is deprecated, and
//! the document is a fixed shape of a dozen keys whose only variable values are strings, which are
//! written as JSON strings (every JSON string is a valid YAML double-quoted scalar), so no value
//! can break the document's structure whatever it contains.
//!
//! Invariant: the file is replaced atomically and is never readable by anyone but its owner
//! (mode 0600, set on the temporary file before any secret is written to it).

// The lead wires `write_admin_kubeconfig` into `skerry server`; until then nothing calls it.

use std::path::Path;

use anyhow::Result;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::pki::{ADMIN_USER, Pki, write_atomic};

/// The name of the cluster and of the context in the kubeconfig.
pub const CONTEXT_NAME: &str = "skerry";

/// Everything a kubeconfig for one user of one cluster holds.
pub struct Kubeconfig<'a> {
    /// The apiserver URL, e.g. `https://127.0.0.1:6443`.
    pub server_url: &'a str,
    /// The cluster CA certificate, PEM.
    pub ca_cert_pem: &'a str,
    /// The user's name in the kubeconfig.
    pub user: &'a str,
    /// The user's client certificate, PEM.
    pub client_cert_pem: &'a str,
    /// The user's client key, PEM.
    pub client_key_pem: &'a str,
}

impl Kubeconfig<'_> {
    /// The kubeconfig as YAML.
    pub fn to_yaml(&self) -> String {
        let quote = |s: &str| serde_json::to_string(s).expect("a string always serialises");
        let data = |pem: &str| quote(&STANDARD.encode(pem));
        let context = quote(CONTEXT_NAME);
        let user = quote(self.user);
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: {context}\n  \
               cluster:\n    \
                 certificate-authority-data: {ca}\n    \
                 server: {server}\n\
             users:\n\
             - name: {user}\n  \
               user:\n    \
                 client-certificate-data: {cert}\n    \
                 client-key-data: {key}\n\
             contexts:\n\
             - name: {context}\n  \
               context:\n    \
                 cluster: {context}\n    \
                 user: {user}\n\
             current-context: {context}\n\
             preferences: {{}}\n",
            ca = data(self.ca_cert_pem),
            server = quote(self.server_url),
            cert = data(self.client_cert_pem),
            key = data(self.client_key_pem),
        )
    }

    /// Writes the kubeconfig to `path` atomically, mode 0600.
    pub fn write(&self, path: &Path) -> Result<()> {
        Ok(write_atomic(path, self.to_yaml().as_bytes(), 0o600)?)
    }
}

/// Writes the admin kubeconfig for `pki` to `path` (atomically, mode 0600): user
/// `kubernetes-admin` with the admin client certificate, cluster and context `skerry` at
/// `server_url`.
pub fn write_admin_kubeconfig(path: &Path, server_url: &str, pki: &Pki) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| anyhow::anyhow!("create {}: {e}", parent.display()))?;
    }
    Kubeconfig {
        server_url,
        ca_cert_pem: pki.ca_cert_pem(),
        user: ADMIN_USER,
        client_cert_pem: &pki.admin().cert_pem,
        client_key_pem: &pki.admin().key_pem,
    }
    .write(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The real kubectl the tests read the file with.
    const KUBECTL: &str = "/usr/bin/kubectl";

    fn kubectl_view(path: &Path, home: &Path, args: &[&str]) -> serde_json::Value {
        let output = Command::new(KUBECTL)
            .args(["config", "view", "--raw", "-o", "json", "--kubeconfig"])
            .arg(path)
            .args(args)
            .env("HOME", home)
            .env_remove("KUBECONFIG")
            .output()
            .expect("run kubectl");
        assert!(
            output.status.success(),
            "kubectl config view failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("kubectl prints JSON")
    }

    #[test]
    fn kubectl_reads_the_admin_kubeconfig() {
        let data = tempfile::tempdir().expect("tempdir");
        let pki = Pki::load_or_create(&data.path().join("pki"), &[]).expect("pki");
        let path = data.path().join("kube").join("config");
        write_admin_kubeconfig(&path, "https://127.0.0.1:6443", &pki).expect("write");
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let view = kubectl_view(&path, data.path(), &[]);
        assert_eq!(view["current-context"], "skerry");
        assert_eq!(view["clusters"][0]["name"], "skerry");
        assert_eq!(
            view["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:6443"
        );
        let ca = view["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .expect("ca data");
        assert_eq!(
            STANDARD.decode(ca).expect("base64"),
            pki.ca_cert_pem().as_bytes()
        );
        assert_eq!(view["users"][0]["name"], ADMIN_USER);
        let cert = view["users"][0]["user"]["client-certificate-data"]
            .as_str()
            .expect("cert data");
        assert_eq!(
            STANDARD.decode(cert).expect("base64"),
            pki.admin().cert_pem.as_bytes()
        );
        let key = view["users"][0]["user"]["client-key-data"]
            .as_str()
            .expect("key data");
        assert_eq!(
            STANDARD.decode(key).expect("base64"),
            pki.admin().key_pem.as_bytes()
        );
        assert_eq!(view["contexts"][0]["context"]["cluster"], "skerry");
        assert_eq!(view["contexts"][0]["context"]["user"], ADMIN_USER);
        // `--minify` resolves the current context: kubectl understood the whole graph.
        let minified = kubectl_view(&path, data.path(), &["--minify"]);
        assert_eq!(minified["clusters"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn awkward_strings_stay_strings() {
        let config = Kubeconfig {
            server_url: "https://[::1]:6443/#x: \"y\"\n- z",
            ca_cert_pem: "ca",
            user: "jane: {admin}",
            client_cert_pem: "cert",
            client_key_pem: "key",
        };
        let data = tempfile::tempdir().expect("tempdir");
        let path = data.path().join("config");
        config.write(&path).expect("write");
        let view = kubectl_view(&path, data.path(), &[]);
        assert_eq!(view["clusters"][0]["cluster"]["server"], config.server_url);
        assert_eq!(view["users"][0]["name"], "jane: {admin}");
    }
}
