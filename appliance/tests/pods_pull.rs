//! Pulls from registries for real: Debian's `docker-registry` on loopback ports (one open,
//! one behind htpasswd auth), the tests' busybox image pushed into both with `skopeo`, and
//! pods of the real binary's node pulling through its supervised containerd. The registries
//! file (`<data-dir>/agent/registries.yaml`, picked up while the node runs) makes an invented
//! registry name a mirror of the open registry and gives the private one credentials;
//! `imagePullSecrets` give them per pod; `imagePullPolicy` and the pull back-off show in the
//! pods' reasons and events. The node harness is `common::node`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::free_port;
use common::kube::tail;
use common::node::{IMAGE, Node, events, missing, missing_prerequisite, running};
use serde_json::Value;
use skerry_node::images::build;

const NODE: &str = "pull-node";
const REGISTRY: &str = "/usr/bin/docker-registry";
const USER: &str = "puller";
const PASSWORD: &str = "s3cret-pw";
/// The name the registries file mirrors to the open registry (no such host exists).
const MIRRORED: &str = "registry.skerry.test";
/// The name the registries file mirrors to the private registry, with its credentials.
const PRIVATE_MIRRORED: &str = "private.skerry.test";

/// A `docker-registry` serving on a loopback port, killed on drop.
struct Registry {
    child: Child,
    port: u16,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Starts one under `dir`, with htpasswd auth if `auth`.
    fn start(dir: &Path, auth: bool) -> Registry {
        let port = free_port();
        std::fs::create_dir_all(dir.join("storage")).expect("storage dir");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("storage").display()
        );
        if auth {
            // docker-registry reads bcrypt htpasswd lines; Python's crypt writes bcrypt.
            let out = Command::new("/usr/bin/python3")
                .args([
                    "-W",
                    "ignore",
                    "-c",
                    "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.METHOD_BLOWFISH))",
                    PASSWORD,
                ])
                .output()
                .expect("python3");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let hash = String::from_utf8_lossy(&out.stdout).trim().to_string();
            assert!(hash.starts_with("$2"), "bcrypt hash: {hash}");
            std::fs::write(dir.join("htpasswd"), format!("{USER}:{hash}\n")).expect("htpasswd");
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: skerry-test\n    path: {}\n",
                dir.join("htpasswd").display()
            ));
        }
        std::fs::write(dir.join("config.yml"), config).expect("config");
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log")).expect("log"))
            .spawn()
            .expect("docker-registry starts");
        let registry = Registry { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "docker-registry did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        registry
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// Pushes the OCI archive into `dest` (`host/repo:tag`) over plain HTTP.
fn push(archive: &Path, dest: &str, creds: Option<&str>) {
    let mut c = Command::new("skopeo");
    c.args(["--insecure-policy", "copy", "--dest-tls-verify=false"]);
    if let Some(creds) = creds {
        c.args(["--dest-creds", creds]);
    }
    let out = c
        .arg(format!("oci-archive:{}", archive.display()))
        .arg(format!("docker://{dest}"))
        .output()
        .expect("skopeo runs");
    assert!(
        out.status.success(),
        "skopeo copy to {dest}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn apply_pod(node: &Node, name: &str, image: &str, policy: Option<&str>, secret: Option<&str>) {
    let mut container = serde_json::json!({
        "name": "main", "image": image, "command": ["sh", "-c", "sleep 3600"]});
    if let Some(p) = policy {
        container["imagePullPolicy"] = Value::from(p);
    }
    let mut pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "containers": [container]}});
    if let Some(s) = secret {
        pod["spec"]["imagePullSecrets"] = serde_json::json!([{"name": s}]);
    }
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
}

/// The waiting reason of the pod's container, if any.
fn waiting_reason(p: &Value) -> String {
    p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn wait_reason(node: &Node, name: &str, reason: &str) -> Value {
    node.wait_pod(name, reason, |p| waiting_reason(p) == reason)
}

fn missing_registry() -> bool {
    missing(
        "pull tests need docker-registry and skopeo (Debian: docker-registry, skopeo)",
        Path::new(REGISTRY).exists() && skerry_node::containerd::find_on_path("skopeo").is_some(),
    )
}

/// Writes the node's registries file (picked up within the watcher's 2 s poll).
fn write_registries(node: &Node, text: &str) -> PathBuf {
    let path = node.data().join("agent/registries.yaml");
    let tmp = node.data().join("agent/.registries.yaml.tmp");
    std::fs::write(&tmp, text).expect("write registries file");
    std::fs::rename(&tmp, &path).expect("rename registries file");
    path
}

#[test]
fn pods_pull_from_registries_with_mirrors_credentials_and_policies() {
    if missing_prerequisite() || missing_registry() {
        return;
    }
    let node = Node::start(NODE);
    let open = Registry::start(&node.kube.path("registry-open"), false);
    let private = Registry::start(&node.kube.path("registry-private"), true);
    let archive = node.kube.path("busybox.tar");
    build::busybox_image(Path::new(build::BUSYBOX), IMAGE)
        .expect("image")
        .write_oci_archive(&archive)
        .expect("write");
    push(&archive, &format!("{}/team/busybox:1", open.host()), None);
    let creds = format!("{USER}:{PASSWORD}");
    push(
        &archive,
        &format!("{}/team/busybox:1", private.host()),
        Some(&creds),
    );
    // The pause image comes from the node itself; wait for the node before pods.
    node.wait_registered();

    // 1. The private registry by its own name, before the registries file gives it credentials:
    //    refused without credentials...
    let direct = format!("{}/team/busybox:1", private.host());
    apply_pod(&node, "no-secret", &direct, Some("Always"), None);
    wait_reason(&node, "no-secret", "ErrImagePull");
    // ... pulled with an imagePullSecret (dockerconfigjson).
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let config = serde_json::json!({"auths": {private.host(): {"auth": auth}}}).to_string();
    node.kube.ok(&[
        "create",
        "secret",
        "generic",
        "regcred",
        "--type=kubernetes.io/dockerconfigjson",
        &format!("--from-literal=.dockerconfigjson={config}"),
    ]);
    apply_pod(
        &node,
        "with-secret",
        &direct,
        Some("Always"),
        Some("regcred"),
    );
    node.wait_pod("with-secret", "running", running);
    // The pod without the secret keeps failing (Always pulls every time).
    let p = node.pod("no-secret");
    assert!(
        ["ErrImagePull", "ImagePullBackOff"].contains(&waiting_reason(&p).as_str()),
        "{p}"
    );

    // The mirror: an invented registry name served by the open registry over plain HTTP,
    // and the private registry's credentials in the file.
    let file = format!(
        "mirrors:\n  {MIRRORED}:\n    endpoint:\n      - \"http://{open}\"\n  {PRIVATE_MIRRORED}:\n    endpoint:\n      - \"http://{private}\"\nconfigs:\n  \"{private}\":\n    auth:\n      username: {USER}\n      password: {PASSWORD}\n",
        open = open.host(),
        private = private.host()
    );
    write_registries(&node, &file);
    let hosts = node.data().join(format!(
        "agent/etc/containerd/certs.d/{MIRRORED}/hosts.toml"
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !hosts.exists() {
        assert!(
            Instant::now() < deadline,
            "the registries file was not rendered\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // 2. Only in the registry, through the mirror: pulled and run, with the events.
    apply_pod(
        &node,
        "mirrored",
        &format!("{MIRRORED}/team/busybox:1"),
        None,
        None,
    );
    node.wait_pod("mirrored", "running", running);
    let ev = events(&node, "mirrored");
    assert!(
        ev.iter()
            .any(|e| e == &format!("Pulling: Pulling image \"{MIRRORED}/team/busybox:1\"")),
        "{ev:?}"
    );
    let pulled = ev
        .iter()
        .find(|e| e.starts_with("Pulled: Successfully pulled image"))
        .unwrap_or_else(|| panic!("no Pulled event: {ev:?}"));
    assert!(
        pulled.contains(" including waiting). Image size: ") && pulled.ends_with(" bytes."),
        "{pulled}"
    );

    // 3. Never with the image absent: ErrImageNeverPull, no pull tried.
    apply_pod(
        &node,
        "never",
        &format!("{MIRRORED}/team/absent:1"),
        Some("Never"),
        None,
    );
    let p = wait_reason(&node, "never", "ErrImageNeverPull");
    assert!(
        p["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("is not present with pull policy of Never"),
        "{p}"
    );
    assert!(
        !events(&node, "never")
            .iter()
            .any(|e| e.starts_with("Pulling")),
        "a Never pod pulled"
    );

    // 4. An image the registry lacks: ErrImagePull, then ImagePullBackOff.
    apply_pod(
        &node,
        "absent",
        &format!("{MIRRORED}/team/absent:1"),
        None,
        None,
    );
    wait_reason(&node, "absent", "ErrImagePull");
    wait_reason(&node, "absent", "ImagePullBackOff");
    let ev = events(&node, "absent");
    assert!(
        ev.iter()
            .any(|e| e.starts_with("Failed: Failed to pull image")),
        "{ev:?}"
    );
    assert!(
        ev.iter()
            .any(|e| e.starts_with("BackOff: Back-off pulling image")),
        "{ev:?}"
    );

    // 5. The registries file's credentials for the mirror of the private registry.
    apply_pod(
        &node,
        "file-creds",
        &format!("{PRIVATE_MIRRORED}/team/busybox:1"),
        Some("Always"),
        None,
    );
    node.wait_pod("file-creds", "running", running);

    // 6. A malformed file: one line naming the file and the field; the node goes on, with
    //    no registry configuration (the mirror's hosts.toml is gone).
    let path = write_registries(&node, "mirrors:\n  docker.io:\n    endpoint: 7\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = node.kube.log();
        if log.contains(&format!("registries file {}: mirrors", path.display())) && !hosts.exists()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no error line for the malformed file\n{}",
            tail(&log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Without the mirror the invented name resolves nowhere.
    apply_pod(
        &node,
        "after",
        &format!("{MIRRORED}/team/busybox:1"),
        Some("Always"),
        None,
    );
    wait_reason(&node, "after", "ErrImagePull");
}
