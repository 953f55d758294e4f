//! What the benchmarks run against: a realistic pod, a single-member store in a temp dir, and
//! a real [`ApiServer`] served over TLS + HTTP/2 on the loopback by the apiserver's own
//! [`server::serve`].
//!
//! The pod is shaped like one a Deployment's ReplicaSet makes and a kubelet reports on (owner
//! reference, probes, resources, env, volume mounts, tolerations, four conditions, a running
//! container status), about 2 KiB of JSON, which is the size the issue asks LIST to carry.
//!
//! Invariant: the server and its store live exactly as long as the [`Harness`]; dropping it
//! signals the listener to stop, and the temp dir goes last.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use futures::StreamExt;
use serde_json::{Value, json};
use skerry_api::ResourceInfo;
use skerry_apiserver::auth::Authenticator;
use skerry_apiserver::handler::Config;
use skerry_apiserver::ipalloc::{SERVICE_CIDR_DEFAULT, ServiceCidr};
use skerry_apiserver::storage;
use skerry_apiserver::watch_cache::WatchCache;
use skerry_apiserver::{ApiServer, server};
use skerry_store::{Store, StoreConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::pki::BenchPki;

/// The namespace of the fan-out's pod: one the apiserver's bootstrap creates, so writes
/// through the API pass the namespace checks.
pub const NAMESPACE: &str = "default";

/// The namespace of the LIST benchmark's pods, apart from the fan-out's so each LIST returns
/// exactly the pods it created. Pods are written straight into the store, so it needs no
/// Namespace object (LIST does not check for one, in Kubernetes either).
pub const LIST_NAMESPACE: &str = "apibench-list";

/// Creates in flight at once while filling the store. A single-member store batches the
/// writes that arrive together into one WAL sync, so a few dozen in flight fill it an order of
/// magnitude faster than one at a time; more only queue. Semi-arbitrary, like the load
/// generator's 64 clients.
pub const CREATES_IN_FLIGHT_MAX: usize = 64;

/// The pod resource.
///
/// # Panics
/// If the catalogue does not serve core/v1 pods (a programmer error).
pub fn pods() -> &'static ResourceInfo {
    skerry_api::catalogue::lookup("", "v1", "pods").expect("the catalogue serves core/v1 pods")
}

/// A pod of about 2 KiB in `namespace`, as a ReplicaSet's pod looks once scheduled and
/// running. `index` makes its uid and IPs unique.
pub fn pod(namespace: &str, name: &str, index: usize) -> Value {
    let ip = format!("10.244.{}.{}", (index / 250) % 250, index % 250 + 2);
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": "web-7d4b9c6f5d-",
            "namespace": namespace,
            "uid": format!("6f1c2a8e-0d4b-4c7e-9a1f-{index:012}"),
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": {
                "app.kubernetes.io/name": "web",
                "app.kubernetes.io/component": "frontend",
                "pod-template-hash": "7d4b9c6f5d",
                "tier": "frontend"
            },
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090"
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-7d4b9c6f5d",
                "uid": "0b5e3d1a-7c2f-4e8b-a6d9-3f1e2c4b5a69",
                "controller": true
            }]
        },
        "spec": {
            "containers": [{
                "name": "web",
                "image": "registry.example.com/shop/web:1.27.3",
                "imagePullPolicy": "IfNotPresent",
                "ports": [
                    {"name": "http", "containerPort": 8080, "protocol": "TCP"}
                ],
                "env": [
                    {"name": "LOG_LEVEL", "value": "info"},
                    {"name": "CACHE_SIZE_MB", "value": "256"}
                ],
                "resources": {
                    "requests": {"cpu": "250m", "memory": "256Mi"},
                    "limits": {"cpu": "1", "memory": "512Mi"}
                },
                "livenessProbe": {
                    "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                    "initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 1,
                    "successThreshold": 1, "failureThreshold": 3
                },
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/web", "readOnly": true}
                ]
            }],
            "volumes": [{"name": "config", "configMap": {"name": "web-config", "defaultMode": 420}}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": format!("node-{}", index % 3),
            "schedulerName": "default-scheduler",
            "priority": 0
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True",
                 "lastTransitionTime": "2025-01-01T00:00:01Z"},
                {"type": "Ready", "status": "True",
                 "lastTransitionTime": "2025-01-01T00:00:09Z"},
                {"type": "ContainersReady", "status": "True",
                 "lastTransitionTime": "2025-01-01T00:00:09Z"},
                {"type": "PodScheduled", "status": "True",
                 "lastTransitionTime": "2025-01-01T00:00:00Z"}
            ],
            "hostIP": format!("192.168.1.{}", index % 3 + 10),
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": "2025-01-01T00:00:01Z",
            "containerStatuses": [{
                "name": "web",
                "ready": true,
                "started": true,
                "restartCount": 0,
                "image": "registry.example.com/shop/web:1.27.3",
                "imageID": "registry.example.com/shop/web@sha256:4f6c1e2d3b5a69788f0e1d2c3b4a59687f6e5d4c3b2a1908f7e6d5c4b3a29180",
                "containerID": format!("containerd://{index:064x}"),
                "state": {"running": {"startedAt": "2025-01-01T00:00:05Z"}}
            }]
        }
    })
}

/// A running apiserver over its own store, and the admin's way in.
pub struct Harness {
    /// The apiserver, shared with the listener task (its caches are read in process).
    pub api: Arc<ApiServer>,
    /// The store under it.
    pub store: Store,
    /// Where the listener accepts connections.
    pub addr: SocketAddr,
    /// The certificates of this run.
    pub pki: BenchPki,
    /// Dropping the sender (with the harness) stops the listener.
    _stop: watch::Sender<bool>,
    /// Declared last: fields drop in order, so the store's files go after everything using
    /// them.
    _dir: tempfile::TempDir,
}

impl Harness {
    /// Opens a store in a temp dir, seeds it (system namespaces, bootstrap RBAC), starts the
    /// apiserver on it, and serves it on `127.0.0.1` on a free port.
    pub async fn start() -> Result<Harness> {
        let dir = tempfile::tempdir().context("create the store's temp dir")?;
        let store = Store::open(StoreConfig::new(dir.path())).context("open the store")?;
        let pki = BenchPki::generate()?;
        let tls = pki.server_config()?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind the API listener")?;
        let addr = listener.local_addr().context("API listener address")?;
        let service_cidr =
            ServiceCidr::parse(SERVICE_CIDR_DEFAULT).map_err(|e| anyhow!("service CIDR: {e}"))?;
        skerry_apiserver::startup::bootstrap(&store, &service_cidr, addr.port())
            .await
            .map_err(|e| anyhow!("bootstrap the store: {}", e.message))?;
        let api = ApiServer::start(
            store.clone(),
            Config {
                server_address: addr.to_string(),
                authenticator: Authenticator {
                    token_file: None,
                    service_accounts: None,
                },
                token_issuer: None,
                // No compactor: a round in the middle of a measurement would be noise.
                compaction_interval: None,
                service_cidr,
                node_port_range: Default::default(),
                extra_metrics: None,
                kubelet_client: None,
                service_account_admission: false,
            },
        );
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(server::serve(api.clone(), listener, tls, stopped));
        let harness = Harness {
            api,
            store,
            addr,
            pki,
            _stop: stop,
            _dir: dir,
        };
        harness
            .pods_cache()
            .wait_fresh(0)
            .await
            .map_err(|e| anyhow!("wait for the pods watch cache: {}", e.message))?;
        Ok(harness)
    }

    /// The apiserver's watch cache of pods.
    ///
    /// # Panics
    /// If the apiserver caches no pods (a programmer error: pods are stored).
    pub fn pods_cache(&self) -> &Arc<WatchCache> {
        self.api
            .caches
            .get("pods")
            .expect("the apiserver starts a watch cache for every stored resource")
    }

    /// Writes `pod(namespace, name, index)` straight into the store (no API round trip), with
    /// the API's defaults applied as a create through the API would (a stored object is always
    /// defaulted; a later `PUT` must not find its defaults changing an immutable spec), and
    /// returns it as stored, with its resourceVersion.
    pub async fn create_pod(&self, namespace: &str, name: &str, index: usize) -> Result<Value> {
        let mut object = pod(namespace, name, index);
        skerry_api::defaults::apply_defaults(pods(), &mut object);
        storage::create(&self.store, pods(), Some(namespace), name, object)
            .await
            .map_err(|e| {
                anyhow!(
                    "create pod {name}: {}",
                    e.into_api_error(pods(), name).message
                )
            })
    }

    /// Writes `count` pods named `{prefix}-{i}` into `namespace` in the store,
    /// [`CREATES_IN_FLIGHT_MAX`] at a time.
    pub async fn create_pods(&self, namespace: &str, prefix: &str, count: usize) -> Result<()> {
        let mut creates = futures::stream::iter(0..count)
            .map(|i| async move {
                self.create_pod(namespace, &format!("{prefix}-{i:05}"), i)
                    .await
            })
            .buffer_unordered(CREATES_IN_FLIGHT_MAX);
        while let Some(result) = creates.next().await {
            result?;
        }
        Ok(())
    }
}

/// `metadata.resourceVersion` of an object, as a number.
pub fn resource_version_of(object: &Value) -> Result<i64> {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|rv| rv.parse().ok())
        .ok_or_else(|| anyhow!("object without a numeric metadata.resourceVersion"))
}

/// The `metadata.resourceVersion` of the object in one JSON watch frame, found by scanning
/// for its key rather than parsing the frame: ten thousand watchers each read every frame,
/// and a parse would cost more than the delivery being measured. A pod carries that key only
/// in its metadata.
pub fn frame_resource_version(frame: &[u8]) -> Option<i64> {
    const KEY: &[u8] = b"\"resourceVersion\":\"";
    let start = frame.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &frame[start..];
    let end = rest.iter().position(|b| *b == b'"')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_is_about_two_kib_as_stored() {
        let mut object = pod(NAMESPACE, "web-7d4b9c6f5d-x2x7k", 12_345);
        skerry_api::defaults::apply_defaults(pods(), &mut object);
        let bytes = serde_json::to_vec(&object).expect("encode");
        assert!(
            (1_800..=2_600).contains(&bytes.len()),
            "pod is {} bytes as stored, not about 2 KiB",
            bytes.len()
        );
    }

    #[test]
    fn frame_resource_version_reads_metadata() {
        let frame = br#"{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"name":"a","resourceVersion":"4711"}}}
"#;
        assert_eq!(frame_resource_version(frame), Some(4711));
        assert_eq!(frame_resource_version(br#"{"type":"MODIFIED"}"#), None);
        assert_eq!(frame_resource_version(br#"{"resourceVersion":"x"}"#), None);
    }
}
