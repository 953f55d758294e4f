//! Volumes on a real file system from objects in a real in-process apiserver: configMap,
//! secret, downwardAPI and projected payloads in upstream's layout (secrets and projected on
//! tmpfs), their errors and events, a ConfigMap update reaching the files through a refresh,
//! a projected token refreshed at 80 % of its life (a test clock), emptyDir with
//! `medium: Memory` mounted as a sized tmpfs and unmounted on teardown, hostPath type checks,
//! and subPaths (an escape through a symlink refused). Mounts need root: these tests run as
//! root here and in CI (`CI=true` makes a missing root a failure).

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Api, Client, Patch, PatchParams, PostParams};
use skerry_node::env::ApiLookup;
use skerry_node::volume::mount;
use skerry_node::volume::token::{ApiTokenSource, Clock, TokenManager, TokenSource};
use skerry_node::volume::{VolumeConfig, VolumeManager};

/// Whether this process may mount. Without root a developer's run skips these tests with a
/// message; under `CI=true` that is a failure, as every missing tool is.
fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the volume tests need root in CI"
    );
    eprintln!("skipped: mounting needs root");
    false
}

fn client(server: &TestServer) -> Client {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = 0.0;
    Client::new(config).unwrap()
}

/// A clock running with the system's but moved ahead on request.
#[derive(Default)]
struct TestClock {
    ahead: Mutex<Duration>,
}

impl Clock for TestClock {
    fn now(&self) -> SystemTime {
        SystemTime::now() + *self.ahead.lock().unwrap()
    }
}

/// The API's token source, counting the requests that reach the apiserver.
struct Counting {
    inner: ApiTokenSource,
    requests: Arc<AtomicUsize>,
}

impl TokenSource for Counting {
    async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, String> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        self.inner
            .request_token(namespace, service_account, request)
            .await
    }
}

struct Fixture {
    server: TestServer,
    client: Client,
    root: tempfile::TempDir,
    manager: VolumeManager<ApiLookup, Counting>,
    clock: Arc<TestClock>,
    token_requests: Arc<AtomicUsize>,
}

impl Drop for Fixture {
    /// Nothing stays mounted in the temp dir whatever the test did.
    fn drop(&mut self) {
        let _ = mount::unmount_all_under(self.root.path());
    }
}

async fn fixture() -> Fixture {
    let server = TestServer::start().await.unwrap();
    let client = client(&server);
    let ns: Api<Namespace> = client.api(None);
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = client.api(Some("shop"));
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "settings"},
            "data": {"app.conf": "level=debug\n", "mode": "fast"},
            // base64 of the bytes 00 ff 10.
            "binaryData": {"blob": "AP8Q"},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let secrets: Api<Secret> = client.api(Some("shop"));
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "creds"},
                "data": {"password": "aHVudGVyMg==", "tls.key": "S0VZ"},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = client.api(Some("shop"));
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "robot"}})).unwrap(),
        )
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let clock = Arc::new(TestClock::default());
    let token_requests = Arc::new(AtomicUsize::new(0));
    let tokens = TokenManager::new(
        Counting {
            inner: ApiTokenSource::new(client.clone()),
            requests: token_requests.clone(),
        },
        clock.clone(),
    );
    let allocatable: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity("4".into())),
        ("memory".to_string(), Quantity("512Mi".into())),
    ]
    .into();
    let manager = VolumeManager::new(
        VolumeConfig {
            root_dir: root.path().to_path_buf(),
            node_allocatable: allocatable,
        },
        ApiLookup::new(client.clone()),
        tokens,
    );
    Fixture {
        server,
        client,
        root,
        manager,
        clock,
        token_requests,
    }
}

fn pod(uid: &str, volumes: serde_json::Value, mounts: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web-0", "namespace": "shop", "uid": uid,
                     "labels": {"app": "web", "tier": "front"}, "annotations": {"note": "a \"b\"\nc"}},
        "spec": {"nodeName": "node-a", "serviceAccountName": "robot",
                 "containers": [{"name": "app", "image": "busybox",
                                 "resources": {"limits": {"memory": "128Mi"}},
                                 "volumeMounts": mounts}],
                 "volumes": volumes},
    }))
    .unwrap()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn read(path: &Path) -> String {
    String::from_utf8(fs::read(path).unwrap()).unwrap()
}

#[tokio::test]
async fn payload_volumes_in_upstreams_layout() {
    if !root_or_skip() {
        return;
    }
    let f = fixture().await;
    let p = pod(
        "uid-1",
        json!([
            {"name": "config", "configMap": {"name": "settings", "defaultMode": 0o640}},
            {"name": "picked", "configMap": {"name": "settings", "items": [
                {"key": "mode", "path": "nested/dir/mode", "mode": 0o600},
                {"key": "blob", "path": "blob.bin"}]}},
            {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}},
            {"name": "info", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "mem_mi", "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}},
                {"path": "cpu", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}}]}},
        ]),
        json!([]),
    );
    let mounted = f.manager.set_up(&p).await.unwrap();
    let dir = |plugin: &str, name: &str| {
        f.root
            .path()
            .join("pods/uid-1/volumes")
            .join(plugin)
            .join(name)
    };
    assert_eq!(
        mounted["config"].path,
        dir("kubernetes.io~configmap", "config")
    );
    assert!(
        mounted.values().all(|v| v.read_only),
        "payload volumes are always read-only"
    );

    let config = dir("kubernetes.io~configmap", "config");
    assert_eq!(read(&config.join("app.conf")), "level=debug\n");
    assert_eq!(fs::read(config.join("blob")).unwrap(), [0x00, 0xff, 0x10]);
    assert_eq!(mode(&config.join("mode")), 0o640);
    assert_eq!(
        fs::read_link(config.join("mode")).unwrap(),
        Path::new("..data/mode")
    );

    let picked = dir("kubernetes.io~configmap", "picked");
    assert_eq!(read(&picked.join("nested/dir/mode")), "fast");
    assert_eq!(mode(&picked.join("nested/dir/mode")), 0o600);
    assert_eq!(
        mode(&picked.join("blob.bin")),
        0o644,
        "the API's default mode"
    );
    assert!(!picked.join("app.conf").exists(), "only the items");

    let creds = dir("kubernetes.io~secret", "creds");
    assert_eq!(read(&creds.join("password")), "hunter2", "base64-decoded");
    assert_eq!(read(&creds.join("tls.key")), "KEY");
    assert_eq!(mode(&creds.join("password")), 0o400);
    assert_eq!(
        mount::mount_at(&creds).unwrap().unwrap().fs_type,
        "tmpfs",
        "secrets never touch a disk"
    );

    let info = dir("kubernetes.io~downward-api", "info");
    assert_eq!(read(&info.join("labels")), "app=\"web\"\ntier=\"front\"");
    assert_eq!(read(&info.join("annotations")), "note=\"a \\\"b\\\"\\nc\"");
    assert_eq!(read(&info.join("name")), "web-0");
    assert_eq!(read(&info.join("mem_mi")), "128");
    assert_eq!(
        read(&info.join("cpu")),
        "4",
        "no limit: the node's allocatable"
    );

    // Set-up is idempotent: nothing rewritten, nothing mounted twice.
    let data_before = fs::read_link(config.join("..data")).unwrap();
    f.manager.set_up(&p).await.unwrap();
    assert_eq!(fs::read_link(config.join("..data")).unwrap(), data_before);
    let tmpfs_on_creds = mount::mounts()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point == fs::canonicalize(&creds).unwrap())
        .count();
    assert_eq!(tmpfs_on_creds, 1);

    f.manager.tear_down("uid-1").await.unwrap();
    assert!(mount::mount_at(f.root.path()).unwrap().is_none());
    assert!(!f.root.path().join("pods/uid-1/volumes").exists());
    assert!(
        !mount::mounts()
            .unwrap()
            .iter()
            .any(|m| m.mount_point.starts_with(f.root.path()))
    );
}

#[tokio::test]
async fn missing_objects_and_keys_fail_with_upstreams_events() {
    if !root_or_skip() {
        return;
    }
    let f = fixture().await;
    let p = pod(
        "uid-2",
        json!([
            {"name": "gone", "configMap": {"name": "absent"}},
            {"name": "maybe", "configMap": {"name": "absent", "optional": true}},
            {"name": "nokey", "configMap": {"name": "settings", "items": [{"key": "nope", "path": "x"}]}},
            {"name": "nosecret", "secret": {"secretName": "absent"}},
            {"name": "badkey", "secret": {"secretName": "creds", "items": [{"key": "nope", "path": "x"}]}},
            {"name": "mixed", "projected": {"sources": [
                {"configMap": {"name": "absent"}},
                {"secret": {"name": "also-absent"}},
                {"configMap": {"name": "settings"}}]}},
            {"name": "host", "hostPath": {"path": "/definitely/not/here", "type": "Directory"}},
            {"name": "nfs", "nfs": {"server": "x", "path": "/"}},
        ]),
        json!([]),
    );
    let err = f.manager.set_up(&p).await.unwrap_err();
    let events: BTreeMap<String, String> = err
        .failures
        .iter()
        .map(|fail| (fail.volume.clone(), fail.event().message))
        .collect();
    assert!(
        err.failures
            .iter()
            .all(|fail| fail.event().reason == "FailedMount")
    );
    assert_eq!(
        events["gone"],
        "MountVolume.SetUp failed for volume \"gone\" : configmap \"absent\" not found"
    );
    assert_eq!(
        events["nokey"],
        "MountVolume.SetUp failed for volume \"nokey\" : configmap references non-existent config key: nope"
    );
    assert_eq!(
        events["nosecret"],
        "MountVolume.SetUp failed for volume \"nosecret\" : secret \"absent\" not found"
    );
    assert_eq!(
        events["badkey"],
        "MountVolume.SetUp failed for volume \"badkey\" : references non-existent secret key: nope"
    );
    assert_eq!(
        events["mixed"],
        "MountVolume.SetUp failed for volume \"mixed\" : [configmap \"absent\" not found, secret \"also-absent\" not found]"
    );
    assert_eq!(
        events["host"],
        "MountVolume.SetUp failed for volume \"host\" : hostPath type check failed: /definitely/not/here is not a directory"
    );
    assert!(
        events["nfs"].contains("supports emptyDir, hostPath"),
        "{}",
        events["nfs"]
    );
    assert!(
        !events.contains_key("maybe"),
        "an optional missing ConfigMap is an empty volume"
    );
    let maybe = f
        .root
        .path()
        .join("pods/uid-2/volumes/kubernetes.io~configmap/maybe");
    assert!(maybe.join("..data").exists());
    assert!(
        !f.root
            .path()
            .join("pods/uid-2/volumes/kubernetes.io~configmap/gone")
            .exists(),
        "nothing made for a failed volume"
    );
    f.manager.tear_down("uid-2").await.unwrap();
}

#[tokio::test]
async fn a_configmap_update_reaches_the_files_on_refresh() {
    if !root_or_skip() {
        return;
    }
    let f = fixture().await;
    let p = pod(
        "uid-3",
        json!([{"name": "config", "configMap": {"name": "settings"}}]),
        json!([]),
    );
    f.manager.set_up(&p).await.unwrap();
    let dir = f
        .root
        .path()
        .join("pods/uid-3/volumes/kubernetes.io~configmap/config");
    assert_eq!(read(&dir.join("mode")), "fast");
    let cms: Api<ConfigMap> = f.client.api(Some("shop"));
    cms.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"mode": "slow", "app.conf": null, "new": "yes"}})),
    )
    .await
    .unwrap();
    f.manager.refresh(&p).await.unwrap();
    assert_eq!(read(&dir.join("mode")), "slow");
    assert_eq!(read(&dir.join("new")), "yes");
    assert!(
        fs::symlink_metadata(dir.join("app.conf")).is_err(),
        "a deleted key's file goes"
    );
    f.manager.tear_down("uid-3").await.unwrap();
}

fn jwt_claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn a_projected_token_is_refreshed_at_eighty_percent_of_its_life() {
    if !root_or_skip() {
        return;
    }
    let f = fixture().await;
    let p = pod(
        "uid-4",
        json!([{"name": "kube-api-access", "projected": {"defaultMode": 0o644, "sources": [
            {"serviceAccountToken": {"path": "token", "audience": "vault", "expirationSeconds": 600}},
            {"configMap": {"name": "settings", "items": [{"key": "mode", "path": "mode"}]}},
            {"secret": {"name": "creds", "items": [{"key": "password", "path": "pw"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
        ]}}]),
        json!([]),
    );
    f.manager.set_up(&p).await.unwrap();
    let dir = f
        .root
        .path()
        .join("pods/uid-4/volumes/kubernetes.io~projected/kube-api-access");
    assert_eq!(mount::mount_at(&dir).unwrap().unwrap().fs_type, "tmpfs");
    assert_eq!(read(&dir.join("mode")), "fast");
    assert_eq!(read(&dir.join("pw")), "hunter2");
    assert_eq!(read(&dir.join("namespace")), "shop");
    let first = read(&dir.join("token"));
    let claims = jwt_claims(&first);
    assert_eq!(claims["aud"], json!(["vault"]));
    assert_eq!(claims["sub"], "system:serviceaccount:shop:robot");
    let life = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert!(
        (599..=600).contains(&life),
        "expirationSeconds is passed: {life}"
    );
    assert_eq!(f.token_requests.load(Ordering::SeqCst), 1);

    // 460 s into a 600 s life: before 80 % (480 s) less the largest jitter (10 s).
    *f.clock.ahead.lock().unwrap() = Duration::from_secs(460);
    f.manager.refresh(&p).await.unwrap();
    assert_eq!(
        f.token_requests.load(Ordering::SeqCst),
        1,
        "no refresh before 80 %"
    );
    assert_eq!(read(&dir.join("token")), first);

    // Real time moves on a second so the apiserver's new token differs in `iat`.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    *f.clock.ahead.lock().unwrap() = Duration::from_secs(490);
    f.manager.refresh(&p).await.unwrap();
    assert_eq!(
        f.token_requests.load(Ordering::SeqCst),
        2,
        "refreshed past 80 %"
    );
    let second = read(&dir.join("token"));
    assert_ne!(second, first, "the file holds the new token");
    assert_eq!(jwt_claims(&second)["aud"], json!(["vault"]));

    assert_eq!(f.manager.tokens().len(), 1);
    f.manager.tear_down("uid-4").await.unwrap();
    assert!(
        f.manager.tokens().is_empty(),
        "the pod's tokens are forgotten"
    );
    assert!(!dir.exists());
}

#[tokio::test]
async fn a_memory_empty_dir_is_a_sized_tmpfs_until_teardown() {
    if !root_or_skip() {
        return;
    }
    let f = fixture().await;
    let p = pod(
        "uid-5",
        json!([
            {"name": "scratch", "emptyDir": {}},
            {"name": "fast", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            // No sizeLimit: the pod's memory limit (128Mi), below the node's 512Mi.
            {"name": "fast-default", "emptyDir": {"medium": "Memory"}},
        ]),
        json!([]),
    );
    let mounted = f.manager.set_up(&p).await.unwrap();
    let scratch = &mounted["scratch"].path;
    assert_eq!(
        *scratch,
        f.root
            .path()
            .join("pods/uid-5/volumes/kubernetes.io~empty-dir/scratch")
    );
    assert_eq!(mode(scratch), 0o777);
    assert!(
        mount::mount_at(scratch).unwrap().is_none(),
        "on the node's disk"
    );
    assert!(!mounted["scratch"].read_only);

    let fast = mount::mount_at(&mounted["fast"].path).unwrap().unwrap();
    assert_eq!(fast.fs_type, "tmpfs");
    assert!(
        fast.super_options.split(',').any(|o| o == "size=65536k"),
        "{}",
        fast.super_options
    );
    let fast_default = mount::mount_at(&mounted["fast-default"].path)
        .unwrap()
        .unwrap();
    assert!(
        fast_default
            .super_options
            .split(',')
            .any(|o| o == "size=131072k"),
        "{}",
        fast_default.super_options
    );
    fs::write(mounted["fast"].path.join("x"), b"in memory").unwrap();

    f.manager.tear_down("uid-5").await.unwrap();
    assert!(
        !mount::mounts()
            .unwrap()
            .iter()
            .any(|m| m.mount_point.starts_with(f.root.path())),
        "unmounted"
    );
    assert!(!f.root.path().join("pods/uid-5/volumes").exists());
}

#[tokio::test]
async fn host_path_types_are_checked() {
    if !root_or_skip() {
        return;
    }
    let f = fixture().await;
    let host = tempfile::tempdir().unwrap();
    let h = |p: &str| host.path().join(p).to_string_lossy().into_owned();
    fs::write(host.path().join("file"), b"x").unwrap();
    fs::create_dir(host.path().join("dir")).unwrap();
    let socket = std::os::unix::net::UnixListener::bind(host.path().join("sock")).unwrap();
    let ok = pod(
        "uid-6",
        json!([
            {"name": "a", "hostPath": {"path": h("new/deep/dir"), "type": "DirectoryOrCreate"}},
            {"name": "b", "hostPath": {"path": h("dir"), "type": "Directory"}},
            {"name": "c", "hostPath": {"path": h("made"), "type": "FileOrCreate"}},
            {"name": "d", "hostPath": {"path": h("file"), "type": "File"}},
            {"name": "e", "hostPath": {"path": h("sock"), "type": "Socket"}},
            {"name": "f", "hostPath": {"path": "/dev/null", "type": "CharDevice"}},
            {"name": "g", "hostPath": {"path": h("anything"), "type": ""}},
            {"name": "i", "hostPath": {"path": h("dir"), "type": "DirectoryOrCreate"}},
        ]),
        json!([]),
    );
    let mounted = f.manager.set_up(&ok).await.unwrap();
    assert!(host.path().join("new/deep/dir").is_dir());
    assert_eq!(mode(&host.path().join("made")) & 0o777, 0o644 & !0o022);
    assert_eq!(fs::metadata(host.path().join("made")).unwrap().len(), 0);
    assert_eq!(mounted["d"].path, host.path().join("file"));
    assert!(
        !host.path().join("anything").exists(),
        "an untyped hostPath is not made"
    );

    let bad = pod(
        "uid-7",
        json!([
            {"name": "dir-is-file", "hostPath": {"path": h("file"), "type": "Directory"}},
            {"name": "file-is-dir", "hostPath": {"path": h("dir"), "type": "File"}},
            {"name": "made-is-dir", "hostPath": {"path": h("dir"), "type": "FileOrCreate"}},
            {"name": "not-socket", "hostPath": {"path": h("file"), "type": "Socket"}},
            {"name": "not-char", "hostPath": {"path": h("file"), "type": "CharDevice"}},
            {"name": "not-block", "hostPath": {"path": "/dev/null", "type": "BlockDevice"}},
            {"name": "weird", "hostPath": {"path": h("file"), "type": "Weird"}},
            {"name": "backstep", "hostPath": {"path": h("dir/../file")}},
        ]),
        json!([]),
    );
    let err = f.manager.set_up(&bad).await.unwrap_err();
    let messages: BTreeMap<_, _> = err
        .failures
        .iter()
        .map(|x| (x.volume.as_str(), x.message.clone()))
        .collect();
    assert_eq!(
        messages["dir-is-file"],
        format!(
            "hostPath type check failed: {} is not a directory",
            h("file")
        )
    );
    assert_eq!(
        messages["file-is-dir"],
        format!("hostPath type check failed: {} is not a file", h("dir"))
    );
    assert_eq!(
        messages["made-is-dir"],
        format!("hostPath type check failed: {} is not a file", h("dir"))
    );
    assert_eq!(
        messages["not-socket"],
        format!(
            "hostPath type check failed: {} is not a socket file",
            h("file")
        )
    );
    assert_eq!(
        messages["not-char"],
        format!(
            "hostPath type check failed: {} is not a character device",
            h("file")
        )
    );
    assert_eq!(
        messages["not-block"],
        "hostPath type check failed: /dev/null is not a block device"
    );
    assert_eq!(messages["weird"], "Weird is an invalid volume type");
    assert_eq!(
        messages["backstep"],
        format!(
            "invalid HostPath `{}`: must not contain '..'",
            h("dir/../file")
        )
    );
    drop(socket);
    f.manager.tear_down("uid-6").await.unwrap();
    f.manager.tear_down("uid-7").await.unwrap();
    assert!(
        host.path().join("file").exists(),
        "teardown never touches a hostPath"
    );
}

#[tokio::test]
async fn sub_paths_are_mounted_safely_and_escapes_refused() {
    if !root_or_skip() {
        return;
    }
    let f = fixture().await;
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("shadow"), b"host secret").unwrap();
    let p = pod(
        "uid-8",
        json!([
            {"name": "data", "emptyDir": {}},
            {"name": "config", "configMap": {"name": "settings"}},
        ]),
        json!([
            {"name": "data", "mountPath": "/logs", "subPathExpr": "logs/$(POD_NAME)"},
            {"name": "config", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
            {"name": "data", "mountPath": "/whole", "readOnly": true},
        ]),
    );
    let mounted = f.manager.set_up(&p).await.unwrap();
    let container = &p.spec.as_ref().unwrap().containers[0];
    let env: BTreeMap<String, String> = [("POD_NAME".to_string(), "web-0".to_string())].into();
    let mounts = f.manager.container_mounts(&p, container, &env).unwrap();
    let pod_dir = f.root.path().join("pods/uid-8");
    // subPathExpr: made as a directory inside the volume and bind-mounted.
    assert_eq!(
        mounts[0].host_path,
        pod_dir.join("volume-subpaths/data/app/0")
    );
    assert!(mounted["data"].path.join("logs/web-0").is_dir());
    fs::write(mounts[0].host_path.join("out.log"), b"line").unwrap();
    assert_eq!(
        read(&mounted["data"].path.join("logs/web-0/out.log")),
        "line",
        "the bind mount is the volume's dir"
    );
    // A file of a configMap volume (itself a symlink into ..data, inside the volume): allowed,
    // read-only as its volume.
    assert_eq!(read(&mounts[1].host_path), "level=debug\n");
    assert!(mounts[1].read_only);
    assert_eq!(mounts[2].host_path, mounted["data"].path);
    assert!(mounts[2].read_only, "readOnly of the mount");
    assert!(!mounts[0].read_only);

    // The pod plants a symlink to the node's files in its emptyDir and asks for it.
    std::os::unix::fs::symlink(outside.path(), mounted["data"].path.join("escape")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("shadow"),
        mounted["data"].path.join("shadow"),
    )
    .unwrap();
    for sub in ["escape", "shadow", "escape/shadow"] {
        let evil: Pod = {
            let mut e = p.clone();
            let c = &mut e.spec.as_mut().unwrap().containers[0];
            c.name = "evil".into();
            c.volume_mounts = Some(vec![
                serde_json::from_value(json!({"name": "data", "mountPath": "/x", "subPath": sub}))
                    .unwrap(),
            ]);
            e
        };
        let c = &evil.spec.as_ref().unwrap().containers[0];
        let err = f.manager.container_mounts(&evil, c, &env).unwrap_err();
        assert_eq!(
            err, "failed to prepare subPath for volumeMount \"data\" of container \"evil\"",
            "{sub}"
        );
    }
    let target = pod_dir.join("volume-subpaths/data/app/0");
    let mounted_targets: Vec<_> = mount::mounts()
        .unwrap()
        .into_iter()
        .filter(|m| {
            m.mount_point
                .starts_with(fs::canonicalize(&pod_dir).unwrap().join("volume-subpaths"))
        })
        .collect();
    assert_eq!(
        mounted_targets.len(),
        2,
        "only the two good subPaths are mounted: {mounted_targets:?}"
    );
    assert!(target.exists());

    // Again: the same bind mounts are reused, not stacked.
    let again = f.manager.container_mounts(&p, container, &env).unwrap();
    assert_eq!(again, mounts);
    let count = || {
        mount::mounts()
            .unwrap()
            .into_iter()
            .filter(|m| {
                m.mount_point
                    .starts_with(fs::canonicalize(&pod_dir).unwrap().join("volume-subpaths"))
            })
            .count()
    };
    assert_eq!(count(), 2);
    // The pod swaps the checked directory for a symlink out: the mount made before stays on
    // what was checked, and a new preparation of that index refuses the link.
    fs::rename(
        mounted["data"].path.join("logs/web-0"),
        mounted["data"].path.join("logs/old"),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), mounted["data"].path.join("logs/web-0")).unwrap();
    assert_eq!(
        read(&target.join("out.log")),
        "line",
        "the bind mount holds the checked directory"
    );
    let err = f.manager.container_mounts(&p, container, &env).unwrap_err();
    assert_eq!(
        err,
        "failed to prepare subPath for volumeMount \"data\" of container \"app\""
    );
    assert!(
        !target.join("shadow").exists(),
        "never bound to the node's directory"
    );

    // Form errors come first, with upstream's words.
    let form = |sub: &str, expr: bool| {
        let mut e = p.clone();
        let key = if expr { "subPathExpr" } else { "subPath" };
        e.spec.as_mut().unwrap().containers[0].volume_mounts = Some(vec![
            serde_json::from_value(json!({"name": "data", "mountPath": "/x", key: sub})).unwrap(),
        ]);
        e
    };
    let e = form("/etc", false);
    assert_eq!(
        f.manager
            .container_mounts(&e, &e.spec.as_ref().unwrap().containers[0], &env)
            .unwrap_err(),
        "error SubPath `/etc` must not be an absolute path"
    );
    let e = form("a/../../b", false);
    assert_eq!(
        f.manager
            .container_mounts(&e, &e.spec.as_ref().unwrap().containers[0], &env)
            .unwrap_err(),
        "unable to provision SubPath `a/../../b`: must not contain '..'"
    );
    let e = form("$(MISSING)", true);
    assert_eq!(
        f.manager
            .container_mounts(&e, &e.spec.as_ref().unwrap().containers[0], &env)
            .unwrap_err(),
        "missing value for MISSING"
    );

    f.manager.tear_down("uid-8").await.unwrap();
    assert!(
        !mount::mounts()
            .unwrap()
            .iter()
            .any(|m| m.mount_point.starts_with(f.root.path()))
    );
    assert_eq!(
        read(&outside.path().join("shadow")),
        "host secret",
        "the node's file is untouched"
    );
    let _ = &f.server;
}
