//! Static pods and their mirror pods (upstream `pkg/kubelet/config/file.go`,
//! `file_linux.go`, `common.go`; `pkg/kubelet/pod/mirror_client.go`; the static / mirror
//! split of `kubelet.go` `SyncPod`, `HandlePodCleanups` and `pod/pod_manager.go`).
//!
//! A static pod is a Pod manifest in `--pod-manifest-path` (k3s keeps them in
//! `<data-dir>/agent/pod-manifests`): every `.yaml`, `.yml` or `.json` file that is not
//! hidden holds one Pod. The folder is read at start, on every inotify event (the `notify`
//! crate) and every `--file-check-frequency`; the set read replaces the previous one, so a
//! new file starts a pod, a changed file replaces it (its content is its UID) and a removed
//! or broken file stops it. A file that is not one valid Pod is logged with its name and
//! why, and runs nothing; the others are unaffected.
//!
//! The pod gets the kubelet's defaults ([`decode_manifest`]): the API's defaults as for a
//! pod created through the API, then `applyDefaults`: a UID hashed from the defaulted content,
//! the node's name and the file's path (so the same manifest is the same pod across kubelet
//! restarts, and any edit is a new pod), the name suffixed `-<node>`, namespace `default`,
//! `spec.nodeName`, `kubernetes.io/config.hash` (the UID), a toleration of every `NoExecute`
//! taint, and from the source `kubernetes.io/config.source: file` and `kubernetes.io/config.seen`.
//!
//! The pod runs as API pods do (admission, a worker, probes, status). The API learns of it
//! through its mirror pod: a copy created by the kubelet with `kubernetes.io/config.mirror:
//! <hash>` and the Node as controlling owner. The trick: the mirror is only a window. The
//! pod source never hands a mirror pod to a worker; a change of a mirror wakes its static
//! pod's worker, whose sync ([`Kubelet::sync_mirror`]) recreates a deleted mirror and
//! replaces one whose hash is stale; the static pod's status is written to the mirror
//! ([`Kubelet::set_status`]), and housekeeping deletes mirrors no manifest backs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use md5::Digest as _;
use serde::Deserialize as _;
use serde_json::{Map, Value, json};
use skerry_client::{Api, PostParams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Kubelet;
use super::pod_workers::{PodUpdate, pod_name};

/// The annotation naming a pod's source (`pkg/kubelet/types` `ConfigSourceAnnotationKey`).
pub const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// The annotation carrying the static pod's hash, its UID (`ConfigHashAnnotationKey`).
pub const HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// The annotation with the time the kubelet first saw the pod (`ConfigFirstSeenAnnotationKey`).
pub const SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// The annotation marking a mirror pod, with its static pod's hash (`ConfigMirrorAnnotationKey`).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The source of manifest pods (`kubetypes.FileSource`).
pub const SOURCE_FILE: &str = "file";
/// The source of API pods (`kubetypes.ApiserverSource`).
pub const SOURCE_API: &str = "api";

/// How often the folder is read again without an inotify event: the kubelet's
/// `--file-check-frequency` default (`fileCheckFrequency`, 20 s in
/// `pkg/kubelet/apis/config/v1beta1/defaults.go`). inotify makes changes seen at once; the
/// rescan catches what inotify cannot see (a folder replaced, a watch that failed).
pub const FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);

/// The largest manifest read: etcd's default request limit (`--max-request-bytes`, 1.5 MiB,
/// `DefaultMaxRequestBytes` in etcd's `server/embed/config.go`), since a pod larger than that
/// cannot have a mirror in the store. Bounds the memory a stray file in the folder costs.
pub const MAX_MANIFEST_BYTES: u64 = 1536 * 1024;

/// The file extensions read as manifests (k3s's manifests are YAML; JSON is YAML).
pub const MANIFEST_EXTENSIONS: &[&str] = &["yaml", "yml", "json"];

/// How long the folder is left to settle after an inotify event before it is read: an editor
/// or `cp` writes a file in several events, and one read after the burst costs less than one
/// per event (a read in the middle of a write is corrected by the next event anyway).
const SETTLE: Duration = Duration::from_millis(100);

/// How often a static pod whose predecessor of the same name is still stopping checks again
/// (upstream's `allowStaticPodStart` waits the same way, on its pod workers' loop).
pub const START_WAIT: Duration = Duration::from_secs(1);

/// Whether `pod` comes from a source other than the API (`kubetypes.IsStaticPod`).
pub fn is_static(pod: &Pod) -> bool {
    annotation(pod, SOURCE_ANNOTATION).is_some_and(|s| s != SOURCE_API)
}

/// Whether `pod` is a mirror pod (`kubetypes.IsMirrorPod`).
pub fn is_mirror(pod: &Pod) -> bool {
    annotation(pod, MIRROR_ANNOTATION).is_some()
}

/// Whether `mirror` is the mirror of `static_pod`: the same full name and the static pod's
/// hash (`pod_manager.go` `IsMirrorPodOf`).
pub fn is_mirror_of(mirror: &Pod, static_pod: &Pod) -> bool {
    mirror.metadata.name == static_pod.metadata.name
        && mirror.metadata.namespace == static_pod.metadata.namespace
        && annotation(mirror, MIRROR_ANNOTATION).is_some()
        && annotation(mirror, MIRROR_ANNOTATION) == annotation(static_pod, HASH_ANNOTATION)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// `namespace/name` of a pod (the kubelet's pod full name, in the API's key order).
fn full_name(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Reads one manifest's bytes into a Pod of this node: one document, a v1 Pod, the API's
/// defaults, the kubelet's `applyDefaults` for the file `source` on `node`, the API's
/// validation (`tryDecodeSinglePod`). The error says why the file is not run.
pub fn decode_manifest(data: &[u8], source: &str, node: &str) -> Result<Pod, String> {
    let mut value = single_document(data)?;
    let Some(object) = value.as_object() else {
        return Err("the document is not an object".to_string());
    };
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if kind != "Pod" || api_version != "v1" {
        return Err(format!(
            "the object is kind {kind:?} of apiVersion {api_version:?}, not a v1 Pod"
        ));
    }
    let resource =
        skerry_api::catalogue::lookup("", "v1", "pods").expect("the catalogue holds pods");
    skerry_api::defaults::apply_defaults(resource, &mut value);
    let uid = match value
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
    {
        Some(uid) => uid.to_string(),
        None => manifest_uid(&value, node, source),
    };
    apply_static_defaults(&mut value, &uid, node);
    let causes = skerry_api::validation::validate_create(resource, &value);
    if !causes.is_empty() {
        let listed: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        return Err(format!("invalid pod: [{}]", listed.join(", ")));
    }
    serde_json::from_value(value).map_err(|e| format!("invalid pod: {e}"))
}

/// The one document of a manifest, as JSON (JSON first, as the apiserver's YAML bodies:
/// exact integers; then YAML, whose parser bounds recursion and alias expansion).
fn single_document(data: &[u8]) -> Result<Value, String> {
    if let Ok(value) = serde_json::from_slice::<Value>(data) {
        return Ok(value);
    }
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_slice(data) {
        let value = Value::deserialize(document)
            .map_err(|e| format!("error converting YAML to JSON: {e}"))?;
        if value.is_null() {
            // An empty document (a leading `---`) holds nothing.
            continue;
        }
        documents.push(value);
        if documents.len() > 1 {
            return Err(
                "the file holds more than one YAML document, a manifest holds one Pod".to_string(),
            );
        }
    }
    documents
        .pop()
        .ok_or_else(|| "the file is empty".to_string())
}

/// The UID the kubelet gives a manifest without one (`common.go` `applyDefaults`): the MD5 of
/// the defaulted pod, then `host:<node>` and `file:<path>`, in hex. Upstream hashes the Go
/// object (`hash.DeepHashObject`); here it is the pod's canonical JSON (keys sorted at every
/// level), so the UID depends on the content only, not on how the file orders or spells it.
pub fn manifest_uid(pod: &Value, node: &str, source: &str) -> String {
    let mut canonical = String::new();
    write_canonical(pod, &mut canonical);
    let mut hasher = md5::Md5::new();
    hasher.update(canonical.as_bytes());
    hasher.update(format!("host:{node}").as_bytes());
    hasher.update(format!("file:{source}").as_bytes());
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push('{');
            let sorted: BTreeMap<&String, &Value> = map.iter().collect();
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The kubelet's part of `applyDefaults` on the JSON pod: UID, name `<name>-<node>` (the
/// node's name in lower case, `generatePodName`), namespace `default`, `spec.nodeName`, the
/// self link (`getSelfLink`), the hash annotation, the `NoExecute` toleration
/// (`AddOrUpdateTolerationInPod`) and phase `Pending`.
fn apply_static_defaults(pod: &mut Value, uid: &str, node: &str) {
    let Some(object) = pod.as_object_mut() else {
        return;
    };
    let meta = object_at(object, "metadata");
    meta.insert("uid".into(), json!(uid));
    let name = meta.get("name").and_then(Value::as_str).unwrap_or("");
    let name = format!("{name}-{}", node.to_lowercase());
    meta.insert("name".into(), json!(name));
    let namespace = match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => ns.to_string(),
        _ => "default".to_string(),
    };
    meta.insert("namespace".into(), json!(namespace));
    meta.insert(
        "selfLink".into(),
        json!(format!("/api/v1/namespaces/{namespace}/pods/{name}")),
    );
    object_at(meta, "annotations").insert(HASH_ANNOTATION.into(), json!(uid));
    let spec = object_at(object, "spec");
    spec.insert("nodeName".into(), json!(node));
    let tolerations = spec
        .entry("tolerations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !tolerations.is_array() {
        *tolerations = Value::Array(Vec::new());
    }
    let list = tolerations.as_array_mut().expect("made an array above");
    let wanted = json!({"operator": "Exists", "effect": "NoExecute"});
    let field = |t: &Value, k: &str| t.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    match list.iter_mut().find(|t| {
        field(t, "key").is_empty()
            && field(t, "operator") == "Exists"
            && field(t, "value").is_empty()
            && field(t, "effect") == "NoExecute"
    }) {
        Some(same) => *same = wanted,
        None => list.push(wanted),
    }
    object_at(object, "status").insert("phase".into(), json!("Pending"));
}

fn object_at<'a>(parent: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = parent
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut().expect("made an object above")
}

/// What reading the folder found: each manifest file and its pod, or why it is not one.
pub type Scan = Vec<(PathBuf, Result<Pod, String>)>;

/// Reads every manifest of `dir` for `node` (`file.go` `extractFromDir`): files in name order,
/// hidden ones and sub-folders skipped, `.yaml` / `.yml` / `.json` only. A folder that cannot be
/// read holds no pods (upstream's "path does not exist, ignoring" stops them too).
pub fn scan(dir: &Path, node: &str) -> Scan {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            warn!(path = %dir.display(), error = %e, "static pods: cannot read --pod-manifest-path");
            return Vec::new();
        }
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    let mut found = Vec::new();
    for path in paths {
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if file_name.starts_with('.') {
            continue;
        }
        let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !MANIFEST_EXTENSIONS.contains(&extension) {
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => {
                debug!(path = %path.display(), "static pods: not recursing into a folder");
                continue;
            }
            Ok(m) if !m.is_file() => {
                found.push((path, Err("not a regular file".to_string())));
                continue;
            }
            Ok(_) => {}
            // Removed between the listing and now.
            Err(_) => continue,
        }
        let pod = read_manifest(&path)
            .and_then(|data| decode_manifest(&data, &path.to_string_lossy(), node));
        found.push((path, pod));
    }
    found
}

fn read_manifest(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut data = Vec::new();
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|e| format!("cannot read: {e}"))?;
    if data.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(format!(
            "the file is larger than {MAX_MANIFEST_BYTES} bytes, the largest pod the store holds"
        ));
    }
    Ok(data)
}

/// The static pods of this kubelet, as the last read of the folder found them.
#[derive(Default)]
pub struct StaticPods {
    inner: Mutex<Inner>,
    /// Whether the folder was read once (or there is none): only then are mirrors without a
    /// manifest orphans (upstream waits for all sources the same way).
    synced: AtomicBool,
}

#[derive(Default)]
struct Inner {
    /// The pods run, by manifest file.
    by_file: BTreeMap<PathBuf, Arc<Pod>>,
    /// When each pod (by UID) was first seen (`kubernetes.io/config.seen`).
    seen: HashMap<String, String>,
    /// The error last logged for each broken file (logged again only when it changes).
    errors: HashMap<PathBuf, String>,
    /// The latest status generated for each static pod: its "status" between syncs, since
    /// a manifest has none and a mirror may be gone or recreated.
    statuses: HashMap<String, PodStatus>,
    /// Static pods removed and still stopping, by UID, with their full name.
    stopping: HashMap<String, (String, String)>,
}

impl StaticPods {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The static pods run.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.lock().by_file.values().cloned().collect()
    }

    /// The static pod named `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.lock()
            .by_file
            .values()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.metadata.name.as_deref() == Some(name)
            })
            .cloned()
    }

    /// Whether the folder was read once.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Marks the source read (no folder: nothing to read).
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// Replaces the pods by what a read of the folder found; returns the updates for the
    /// pod workers (removed pods first, so a replaced pod's predecessor is known to stop).
    pub fn apply(&self, scan: Scan) -> Vec<PodUpdate> {
        let mut inner = self.lock();
        let mut next: BTreeMap<PathBuf, Arc<Pod>> = BTreeMap::new();
        let mut names: HashSet<(String, String)> = HashSet::new();
        let mut uids: HashSet<String> = HashSet::new();
        let mut errors = HashMap::new();
        let now = jiff::Timestamp::now().to_string();
        for (path, result) in scan {
            let pod = result.and_then(|pod| {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if !names.insert(full_name(&pod)) {
                    return Err(format!(
                        "a pod named {} comes from an earlier file, this one is ignored",
                        pod_name(&pod)
                    ));
                }
                if !uids.insert(uid.clone()) {
                    return Err(format!(
                        "uid {uid} comes from an earlier file, this one is ignored"
                    ));
                }
                Ok(pod)
            });
            let mut pod = match pod {
                Ok(pod) => pod,
                Err(reason) => {
                    if inner.errors.get(&path) != Some(&reason) {
                        warn!(file = %path.display(), %reason, "static pods: the manifest is not run");
                    }
                    errors.insert(path, reason);
                    continue;
                }
            };
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let seen = inner.seen.entry(uid).or_insert_with(|| now.clone()).clone();
            let annotations = pod
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            annotations.insert(SOURCE_ANNOTATION.to_string(), SOURCE_FILE.to_string());
            annotations.insert(SEEN_ANNOTATION.to_string(), seen);
            next.insert(path, Arc::new(pod));
        }
        inner.errors = errors;
        let old: HashMap<String, Arc<Pod>> = inner
            .by_file
            .values()
            .map(|p| (p.metadata.uid.clone().unwrap_or_default(), p.clone()))
            .collect();
        let mut updates = Vec::new();
        for (uid, pod) in &old {
            if !uids.contains(uid) {
                info!(pod = %pod_name(pod), %uid, "static pods: the manifest is gone or changed; stopping the pod");
                inner.stopping.insert(uid.clone(), full_name(pod));
                updates.push(PodUpdate::Removed(pod.clone()));
            }
        }
        for pod in next.values() {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if !old.contains_key(&uid) {
                info!(pod = %pod_name(pod), %uid, "static pods: a new manifest");
                updates.push(PodUpdate::Pod(pod.clone()));
            }
        }
        inner.seen.retain(|uid, _| uids.contains(uid));
        inner.by_file = next;
        updates
    }

    /// Whether `pod` must wait: a removed static pod of the same full name still stops
    /// (`pod_workers.go` `allowStaticPodStart`: one instance of a static pod at a time).
    pub fn must_wait(&self, pod: &Pod) -> bool {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let name = full_name(pod);
        self.lock()
            .stopping
            .iter()
            .any(|(other, n)| other != uid && *n == name)
    }

    /// Forgets a pod that has stopped and been cleaned up; returns the static pod of the same
    /// full name that waited for it, if any.
    pub fn forget(&self, uid: &str) -> Option<Arc<Pod>> {
        let mut inner = self.lock();
        inner.statuses.remove(uid);
        let (namespace, name) = inner.stopping.remove(uid)?;
        inner
            .by_file
            .values()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && p.metadata.name.as_deref() == Some(name.as_str())
            })
            .cloned()
    }

    fn remember_status(&self, uid: &str, status: &PodStatus) {
        self.lock().statuses.insert(uid.to_string(), status.clone());
    }

    /// `update` with a static pod's latest status in place of the manifest's.
    pub fn with_status(&self, update: PodUpdate) -> PodUpdate {
        match update {
            PodUpdate::Pod(pod) if is_static(&pod) => {
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                match self.lock().statuses.get(uid) {
                    Some(status) => {
                        let mut pod = (*pod).clone();
                        pod.status = Some(status.clone());
                        PodUpdate::Pod(Arc::new(pod))
                    }
                    None => PodUpdate::Pod(pod),
                }
            }
            other => other,
        }
    }
}

impl Kubelet {
    /// The static pods.
    pub fn static_pods(&self) -> &StaticPods {
        &self.static_pods
    }

    /// A removed static pod (or any pod) is cleaned up: its successor of the same name, if
    /// one waits, starts now rather than at its next check.
    pub(super) fn pod_gone(&self, uid: &str) {
        if let Some(next) = self.static_pods.forget(uid)
            && let Some(next_uid) = next.metadata.uid.as_deref()
        {
            self.workers.wake(next_uid);
        }
    }

    /// The API pod named like `pod` if it is a mirror pod.
    fn mirror_in_store(&self, pod: &Pod) -> Option<Arc<Pod>> {
        let (namespace, name) = full_name(pod);
        self.pods
            .get()
            .and_then(|s| s.get_by(&namespace, &name))
            .filter(|p| is_mirror(p))
    }

    /// Writes a pod's status: an API pod's to itself, a static pod's to its mirror, if the
    /// mirror is there (`status_manager.go` `syncPod` with `TranslatePodUID`; without a mirror
    /// the status waits for the next sync, which the mirror's arrival wakes).
    pub async fn set_status(
        &self,
        pod: &Pod,
        status: &PodStatus,
    ) -> Result<bool, skerry_client::Error> {
        if !is_static(pod) {
            return self.statuses.set(pod, status).await;
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.static_pods.remember_status(uid, status);
        match self.mirror_in_store(pod) {
            Some(mirror)
                if is_mirror_of(&mirror, pod) && mirror.metadata.deletion_timestamp.is_none() =>
            {
                self.statuses.set_on(uid, &mirror, status).await
            }
            _ => Ok(false),
        }
    }

    /// Makes the mirror of the static `pod` right (`kubelet.go` `SyncPod`): a mirror being
    /// deleted or of another hash is deleted, and a missing one created.
    pub async fn sync_mirror(&self, pod: &Pod) {
        let existing = self.mirror_in_store(pod);
        let mut create = existing.is_none();
        if let Some(mirror) = existing
            && (mirror.metadata.deletion_timestamp.is_some() || !is_mirror_of(&mirror, pod))
        {
            info!(pod = %pod_name(pod), "deleting a mirror pod that is outdated or being deleted");
            match self.delete_mirror(&mirror).await {
                Ok(()) => create = true,
                Err(e) => warn!(pod = %pod_name(pod), error = %e, "deleting a mirror pod failed"),
            }
        }
        if create {
            self.create_mirror(pod).await;
        }
    }

    /// Creates the mirror of `pod` (`mirror_client.go` `CreateMirrorPod`): its copy with the
    /// mirror annotation and the Node as controlling owner (upstream since 1.17, so the
    /// NodeRestriction admission can tie it to its node and the garbage collector to the Node).
    async fn create_mirror(&self, pod: &Pod) {
        let Some(node_uid) = self.node_uid().await else {
            return;
        };
        let mut mirror = pod.clone();
        let hash = annotation(pod, HASH_ANNOTATION)
            .unwrap_or_default()
            .to_string();
        let meta = &mut mirror.metadata;
        meta.uid = None;
        meta.resource_version = None;
        meta.self_link = None;
        meta.creation_timestamp = None;
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(MIRROR_ANNOTATION.to_string(), hash);
        meta.owner_references = Some(vec![OwnerReference {
            api_version: "v1".to_string(),
            kind: "Node".to_string(),
            name: self.config.node_name.clone(),
            uid: node_uid,
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        mirror.status = None;
        let api: Api<Pod> = self.client.api(pod.metadata.namespace.as_deref());
        match api.create(&PostParams::default(), &mirror).await {
            Ok(_) => info!(pod = %pod_name(pod), "mirror pod created"),
            // Created a moment ago and not yet in the store: the next sync checks its hash.
            Err(e) if e.is_already_exists() => {
                debug!(pod = %pod_name(pod), "the mirror pod exists")
            }
            Err(e) => warn!(pod = %pod_name(pod), error = %e, "creating the mirror pod failed"),
        }
    }

    /// Deletes a mirror pod: grace 0, its UID as precondition (`DeleteMirrorPod`).
    async fn delete_mirror(&self, mirror: &Pod) -> Result<(), skerry_client::Error> {
        self.statuses.delete(mirror).await
    }

    /// The Node's UID, read at each mirror creation (a Node registered again has another
    /// UID, and a mirror owned by a gone UID would be collected); `None` (logged) while it
    /// cannot be read, or while the Node is being deleted (no mirror then, as upstream).
    async fn node_uid(&self) -> Option<String> {
        let api: Api<k8s_openapi::api::core::v1::Node> = self.client.api(None);
        match api.get(&self.config.node_name).await {
            Ok(node) if node.metadata.deletion_timestamp.is_some() => {
                warn!("the Node is being deleted; no mirror pods");
                None
            }
            Ok(node) => node.metadata.uid,
            Err(e) => {
                warn!(error = %e, "reading the Node for a mirror pod's owner failed");
                None
            }
        }
    }

    /// Reads the folder and hands the changes to the pod workers.
    fn apply_scan(self: &Arc<Self>, scan: Scan, rt: &tokio::runtime::Handle) {
        for update in self.static_pods.apply(scan) {
            self.workers.update(self, update, rt);
        }
        self.static_pods.mark_synced();
    }

    /// The static pod source (`file.go` `run`, `file_linux.go` `watch`): reads `dir` now, then
    /// on every inotify event of it and every `every`, until `stop`.
    pub(super) async fn run_static_source(
        self: Arc<Self>,
        dir: PathBuf,
        every: Duration,
        stop: CancellationToken,
    ) {
        let rt = tokio::runtime::Handle::current();
        if let Err(e) = tokio::fs::create_dir_all(&dir).await {
            warn!(path = %dir.display(), error = %e, "static pods: cannot create --pod-manifest-path");
        }
        let wake = Arc::new(Notify::new());
        let mut watcher = watch(&dir, &wake);
        loop {
            let node = self.config.node_name.clone();
            let path = dir.clone();
            match tokio::task::spawn_blocking(move || scan(&path, &node)).await {
                Ok(found) => self.apply_scan(found, &rt),
                Err(e) => warn!(error = %e, "static pods: reading the folder failed"),
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = wake.notified() => tokio::time::sleep(SETTLE).await,
                () = stop.cancelled() => return,
            }
            if watcher.is_none() {
                watcher = watch(&dir, &wake);
            }
        }
    }

    /// Deletes mirror pods no static pod backs (`HandlePodCleanups` `deleteOrphanedMirrorPods`),
    /// once the folder was read.
    pub(super) async fn delete_orphaned_mirrors(&self, api_pods: &[Arc<Pod>]) {
        if !self.static_pods.is_synced() {
            return;
        }
        for mirror in api_pods.iter().filter(|p| is_mirror(p)) {
            let (namespace, name) = full_name(mirror);
            if self.static_pods.get(&namespace, &name).is_some() {
                continue;
            }
            info!(pod = %pod_name(mirror), "deleting a mirror pod whose static pod is gone");
            if let Err(e) = self.delete_mirror(mirror).await {
                warn!(pod = %pod_name(mirror), error = %e, "deleting an orphaned mirror pod failed");
            }
        }
    }
}

/// An inotify watch of `dir` waking `wake`; `None` (logged once per try) when it cannot be
/// set, and the periodic rescan alone sees changes.
fn watch(dir: &Path, wake: &Arc<Notify>) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher as _;
    let wake = wake.clone();
    let handler = move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            wake.notify_one();
        }
    };
    let watched = notify::recommended_watcher(handler).and_then(|mut w| {
        w.watch(dir, notify::RecursiveMode::NonRecursive)?;
        Ok(w)
    });
    match watched {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(path = %dir.display(), error = %e, "static pods: no inotify watch; rescanning only");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "Edge-1";
    const FILE: &str = "/etc/manifests/web.yaml";

    fn decode(text: &str) -> Result<Pod, String> {
        decode_manifest(text.as_bytes(), FILE, NODE)
    }

    const WEB: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox\n";

    #[test]
    fn the_kubelets_defaults() {
        let pod = decode(WEB).expect("a pod");
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-edge-1"));
        assert_eq!(meta.namespace.as_deref(), Some("default"));
        let uid = meta.uid.clone().expect("uid");
        assert_eq!(uid.len(), 32);
        assert!(uid.chars().all(|c| c.is_ascii_hexdigit()));
        let annotations = meta.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.get(HASH_ANNOTATION), Some(&uid));
        assert_eq!(
            meta.self_link.as_deref(),
            Some("/api/v1/namespaces/default/pods/web-edge-1")
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some(NODE));
        let tolerations = spec.tolerations.as_ref().expect("tolerations");
        assert_eq!(tolerations.len(), 1);
        assert_eq!(tolerations[0].operator.as_deref(), Some("Exists"));
        assert_eq!(tolerations[0].effect.as_deref(), Some("NoExecute"));
        assert!(tolerations[0].key.is_none());
        // The API's defaults, as for a pod created through the API.
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("Always")
        );
        assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    }

    #[test]
    fn the_uid_is_the_content_the_node_and_the_file() {
        let uid = |text: &str, file: &str, node: &str| {
            decode_manifest(text.as_bytes(), file, node)
                .expect("a pod")
                .metadata
                .uid
                .expect("uid")
        };
        let base = uid(WEB, FILE, NODE);
        // Deterministic: a restarted kubelet finds its pods again.
        assert_eq!(base, uid(WEB, FILE, NODE));
        // The same pod written otherwise (JSON, keys in another order) is the same pod.
        let json = r#"{"spec":{"containers":[{"image":"busybox","name":"c"}]},"kind":"Pod","metadata":{"name":"web"},"apiVersion":"v1"}"#;
        assert_eq!(base, uid(json, FILE, NODE));
        // Any change of content, of file or of node is another pod.
        assert_ne!(base, uid(&WEB.replace("busybox", "busybox:1"), FILE, NODE));
        assert_ne!(base, uid(WEB, "/etc/manifests/other.yaml", NODE));
        assert_ne!(base, uid(WEB, FILE, "edge-2"));
        // A default written out is no change: the hash is taken after the API's defaults.
        let explicit = WEB.replace("spec:\n", "spec:\n  restartPolicy: Always\n");
        assert_eq!(base, uid(&explicit, FILE, NODE));
        // A manifest's own UID is kept (`applyDefaults` hashes only when there is none).
        let own = WEB.replace("name: web\n", "name: web\n  uid: own-uid\n");
        assert_eq!(uid(&own, FILE, NODE), "own-uid");
    }

    #[test]
    fn the_uid_is_md5_of_canonical_json_then_host_and_file() {
        let pod = json!({"b": 1, "a": {"d": [true, null], "c": "x"}});
        let mut canonical = String::new();
        write_canonical(&pod, &mut canonical);
        assert_eq!(canonical, r#"{"a":{"c":"x","d":[true,null]},"b":1}"#);
        let mut hasher = md5::Md5::new();
        hasher.update(format!("{canonical}host:nfile:/f").as_bytes());
        let expected: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(manifest_uid(&pod, "n", "/f"), expected);
    }

    #[test]
    fn a_namespace_and_tolerations_are_kept() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: kube-system\nspec:\n  tolerations:\n  - operator: Exists\n    effect: NoExecute\n    tolerationSeconds: 5\n  - key: k\n    operator: Exists\n  containers:\n  - name: c\n    image: busybox\n";
        let pod = decode(text).expect("a pod");
        assert_eq!(pod.metadata.namespace.as_deref(), Some("kube-system"));
        let tolerations = pod.spec.expect("spec").tolerations.expect("tolerations");
        // The matching toleration is replaced, not duplicated; the other one stays.
        assert_eq!(tolerations.len(), 2);
        assert_eq!(tolerations[0].toleration_seconds, None);
        assert_eq!(tolerations[1].key.as_deref(), Some("k"));
    }

    #[test]
    fn bad_manifests_say_why() {
        let err = |text: &str| decode(text).expect_err("refused");
        assert!(err("a: [").contains("error converting YAML to JSON"));
        assert!(err("").contains("empty"));
        assert!(err(&format!("{WEB}---\n{WEB}")).contains("more than one YAML document"));
        assert!(
            err("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n")
                .contains("kind \"ConfigMap\"")
        );
        let invalid =
            err("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers: []\n");
        assert!(invalid.starts_with("invalid pod: ["), "{invalid}");
        assert!(invalid.contains("spec.containers"), "{invalid}");
        let bad_name = err(&WEB.replace("name: web\n", "name: Web_1\n"));
        assert!(bad_name.contains("metadata.name"), "{bad_name}");
        // A leading `---` is no second document.
        assert!(decode(&format!("---\n{WEB}")).is_ok());
    }

    fn pods_of(scan: Scan) -> Vec<String> {
        scan.into_iter()
            .filter_map(|(_, r)| r.ok())
            .filter_map(|p| p.metadata.name)
            .collect()
    }

    #[test]
    fn the_folder_hidden_files_other_extensions_and_folders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).expect("write");
        };
        write("a.yaml", WEB);
        write("b.yml", &WEB.replace("name: web", "name: b"));
        write(
            "c.json",
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"c"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#,
        );
        write(".hidden.yaml", &WEB.replace("name: web", "name: hidden"));
        write("notes.txt", &WEB.replace("name: web", "name: txt"));
        write("broken.yaml", "kind: [");
        std::fs::create_dir(dir.path().join("sub.yaml")).expect("mkdir");
        let found = scan(dir.path(), "n");
        assert_eq!(found.len(), 4, "{found:?}");
        let broken = found
            .iter()
            .find(|(p, _)| p.ends_with("broken.yaml"))
            .expect("the broken file is reported");
        assert!(broken.1.is_err());
        assert_eq!(pods_of(found), ["web-n", "b-n", "c-n"]);
        assert!(scan(&dir.path().join("missing"), "n").is_empty());
    }

    #[test]
    fn a_rescan_adds_replaces_and_removes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("web.yaml");
        std::fs::write(&path, WEB).expect("write");
        let pods = StaticPods::default();
        let first = pods.apply(scan(dir.path(), "n"));
        assert!(matches!(first.as_slice(), [PodUpdate::Pod(_)]));
        let pod = pods.get("default", "web-n").expect("the pod");
        assert!(is_static(&pod));
        let annotations = pod.metadata.annotations.clone().expect("annotations");
        assert_eq!(
            annotations.get(SOURCE_ANNOTATION).map(String::as_str),
            Some("file")
        );
        let seen = annotations.get(SEEN_ANNOTATION).cloned().expect("seen");
        // Nothing changed: no update, and the first-seen time stays.
        assert!(pods.apply(scan(dir.path(), "n")).is_empty());
        let again = pods.get("default", "web-n").expect("the pod");
        assert_eq!(
            again
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SEEN_ANNOTATION)),
            Some(&seen)
        );
        // An edit: the old pod removed, the new one added; the new one waits for the old.
        std::fs::write(&path, WEB.replace("busybox", "busybox:2")).expect("write");
        let edit = pods.apply(scan(dir.path(), "n"));
        let [PodUpdate::Removed(old), PodUpdate::Pod(new)] = edit.as_slice() else {
            panic!("{edit:?}");
        };
        assert_eq!(old.metadata.uid, pod.metadata.uid);
        assert_ne!(new.metadata.uid, pod.metadata.uid);
        assert!(pods.must_wait(new));
        let waiting = pods.forget(old.metadata.uid.as_deref().expect("uid"));
        assert_eq!(
            waiting.and_then(|p| p.metadata.uid.clone()),
            new.metadata.uid
        );
        assert!(!pods.must_wait(new));
        // Broken: the pod stops, as when the file goes.
        std::fs::write(&path, "kind: [").expect("write");
        assert!(matches!(
            pods.apply(scan(dir.path(), "n")).as_slice(),
            [PodUpdate::Removed(_)]
        ));
        assert!(pods.pods().is_empty());
        // Two files, one name: the first wins.
        std::fs::write(&path, WEB).expect("write");
        std::fs::write(dir.path().join("x-copy.yaml"), WEB).expect("write");
        let both = pods.apply(scan(dir.path(), "n"));
        assert_eq!(both.len(), 1, "{both:?}");
        assert_eq!(pods.pods().len(), 1);
    }

    #[test]
    fn mirrors_are_told_apart() {
        let pod = decode(WEB).expect("a pod");
        assert!(
            !is_static(&pod),
            "the source annotation comes from the source"
        );
        let mut static_pod = pod.clone();
        static_pod
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(SOURCE_ANNOTATION.into(), SOURCE_FILE.into());
        assert!(is_static(&static_pod) && !is_mirror(&static_pod));
        let mut mirror = static_pod.clone();
        let hash = mirror.metadata.uid.clone().expect("uid");
        mirror
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(MIRROR_ANNOTATION.into(), hash);
        assert!(is_mirror(&mirror) && is_mirror_of(&mirror, &static_pod));
        let mut stale = mirror.clone();
        stale
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(MIRROR_ANNOTATION.into(), "0".into());
        assert!(!is_mirror_of(&stale, &static_pod));
        let mut api = pod;
        api.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(SOURCE_ANNOTATION.into(), SOURCE_API.into());
        assert!(!is_static(&api));
    }
}
