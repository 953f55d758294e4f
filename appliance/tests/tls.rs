//! The etcd API over TLS with the real etcdctl: `https://` client URLs with `--cert-file` and
//! `--key-file`, and with `--client-cert-auth` a client certificate signed by
//! `--trusted-ca-file` required. Certificates are made here with `skerry_tls::pki`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Server;
use skerry_tls::pki::{Ca, LeafSpec, Names, Usage};

/// Issues a leaf for `san` with `usage` from `ca` and writes it as `dir/{name}.crt` and
/// `dir/{name}.key`; returns their paths.
fn write_cert(dir: &Path, name: &str, ca: &Ca, san: &str, usage: Usage) -> (PathBuf, PathBuf) {
    let leaf = ca
        .issue(&LeafSpec::new(name, usage).names(Names::of([san])))
        .expect("issue");
    let cert_path = dir.join(format!("{name}.crt"));
    let key_path = dir.join(format!("{name}.key"));
    leaf.write(&cert_path, &key_path).expect("write the pair");
    (cert_path, key_path)
}

/// A CA with a name of its own (OpenSSL, so curl, takes a leaf whose issuer name equals its
/// subject name for a self-signed certificate), written as `dir/ca.crt`.
fn write_ca(dir: &Path) -> (PathBuf, Ca) {
    let ca = Ca::generate("skerry test CA").expect("CA");
    let path = dir.join("ca.crt");
    std::fs::write(&path, ca.cert_pem()).expect("write ca");
    (path, ca)
}

fn etcdctl(args: &[&str]) -> std::process::Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--command-timeout=5s")
        .args(args)
        .output()
        .expect("run etcdctl")
}

#[test]
fn etcdctl_speaks_tls_and_a_client_without_a_certificate_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path();
    let (ca, issuer) = write_ca(pki);
    let (server_cert, server_key) = write_cert(pki, "server", &issuer, "127.0.0.1", Usage::Server);
    let (client_cert, client_key) = write_cert(pki, "client", &issuer, "client", Usage::Client);
    let arg = |p: &PathBuf| p.display().to_string();
    let (server_cert, server_key, ca, client_cert, client_key) = (
        arg(&server_cert),
        arg(&server_key),
        arg(&ca),
        arg(&client_cert),
        arg(&client_key),
    );
    let metrics_url = format!("https://127.0.0.1:{}", common::free_port());
    let server = Server::start_https(
        &dir.path().join("data"),
        &[
            "--cert-file",
            &server_cert,
            "--key-file",
            &server_key,
            "--trusted-ca-file",
            &ca,
            "--client-cert-auth",
            "--listen-metrics-urls",
            &metrics_url,
        ],
    );
    let endpoint = format!("https://127.0.0.1:{}", server.port());
    let tls = [
        "--endpoints",
        endpoint.as_str(),
        "--cacert",
        ca.as_str(),
        "--cert",
        client_cert.as_str(),
        "--key",
        client_key.as_str(),
    ];
    let put = etcdctl(&[&tls[..], &["put", "k", "over-tls"]].concat());
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = etcdctl(&[&tls[..], &["get", "k", "--print-value-only"]].concat());
    assert_eq!(String::from_utf8_lossy(&get.stdout), "over-tls\n");
    // curl on the same port, offering h2 and http/1.1 as it does by default, gets the HTTP
    // face over HTTP/1.1 (etcdctl, offering h2 alone, got gRPC).
    let curl = |url: &str, data: Option<&str>| {
        let mut c = Command::new("curl");
        c.args(["-s", "--max-time", "10", "-w", "\n%{http_version}"])
            .args([
                "--cacert",
                &ca,
                "--cert",
                &client_cert,
                "--key",
                &client_key,
            ]);
        if let Some(data) = data {
            c.args(["-X", "POST", "-d", data]);
        }
        let out = c.arg(url).output().expect("run curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        curl(&format!("{endpoint}/health"), None),
        "{\"health\":\"true\"}\n1.1"
    );
    let range = curl(
        &format!("{endpoint}/v3/kv/range"),
        Some(r#"{"key":"aw=="}"#),
    );
    assert!(range.contains(r#""value":"b3Zlci10bHM=""#), "{range}");
    // An https metrics URL uses the client TLS files.
    let metrics = curl(&format!("{metrics_url}/metrics"), None);
    assert!(metrics.contains("etcd_server_has_leader 1"), "{metrics}");
    // Without a client certificate the handshake fails.
    let anonymous = etcdctl(&[
        "--endpoints",
        endpoint.as_str(),
        "--cacert",
        ca.as_str(),
        "get",
        "k",
    ]);
    assert!(!anonymous.status.success());
    // Plain http on the TLS port gets nothing either.
    let plain = etcdctl(&[
        "--endpoints",
        &format!("127.0.0.1:{}", server.port()),
        "get",
        "k",
    ]);
    assert!(!plain.status.success());
}

#[test]
fn tls_flags_without_https_urls_and_the_reverse_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args([
            "server",
            "--secure-port=0",
            "--data-dir",
            &dir.path().join("d").display().to_string(),
            "--listen-client-urls",
            "https://127.0.0.1:1",
        ])
        .output()
        .expect("run skerry");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cert-file"));
    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args([
            "server",
            "--secure-port=0",
            "--data-dir",
            &dir.path().join("d").display().to_string(),
            "--listen-client-urls",
            "http://127.0.0.1:1",
            "--client-cert-auth",
        ])
        .output()
        .expect("run skerry");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("https"));
}

#[test]
fn a_tls_client_that_says_nothing_after_its_handshake_is_closed_at_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path();
    let (ca, issuer) = write_ca(pki);
    let (server_cert, server_key) = write_cert(pki, "server", &issuer, "127.0.0.1", Usage::Server);
    let arg = |p: &PathBuf| p.display().to_string();
    let server = Server::start_https(
        &dir.path().join("data"),
        &[
            "--cert-file",
            &arg(&server_cert),
            "--key-file",
            &arg(&server_key),
        ],
    );
    let connect = format!("127.0.0.1:{}", server.port());
    // For each protocol: a client that finishes the handshake, then keeps its side open and
    // silent. The server closes it about 10 s later (the client port's first-bytes deadline
    // for h2, its request-head deadline for HTTP/1.1); s_client then exits.
    for alpn in ["h2", "http/1.1"] {
        let started = std::time::Instant::now();
        let mut client = Command::new("openssl")
            .args(["s_client", "-quiet", "-connect", &connect, "-alpn", alpn])
            .args(["-CAfile", &arg(&ca)])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run openssl s_client");
        let exited = loop {
            if let Ok(Some(_)) = client.try_wait() {
                break Some(started.elapsed());
            }
            if started.elapsed() > std::time::Duration::from_secs(25) {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let _ = client.kill();
        let _ = client.wait();
        let exited = exited.unwrap_or_else(|| panic!("{alpn}: still open after 25 s"));
        assert!(
            exited >= std::time::Duration::from_secs(9),
            "{alpn}: closed after {exited:?}, before the deadline"
        );
    }
}
