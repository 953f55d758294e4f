//! The Node authorizer's graph: which pods are bound to each node, which secrets,
//! configmaps, persistentvolumeclaims and service accounts their pods reference, and which
//! PersistentVolumes are bound to those claims with which secrets (Kubernetes'
//! `plugin/pkg/auth/authorizer/node/graph.go` and `graph_populator.go`).
//!
//! Upstream keeps a general vertex/edge graph fed by informers and walks it depth first. The
//! relations are short here, so the graph is kept as maps: each pod's node and references;
//! per object a pod references, how many pods of each node reference it ("has node N a path
//! to secret ns/s" is one lookup); and each PersistentVolume's claim (`spec.claimRef`, the
//! `pv → pvc` edge upstream's `AddPV` draws) and the secrets it names, with an index from
//! secret to volumes. A volume or a volume's secret is reached in two or three lookups:
//! secret → volume → its claim → the claim's nodes.
//!
//! The trick: the graph follows the pods' watch cache, which the apiserver already keeps,
//! without a watch of its own. When a decision needs it and the cache's resourceVersion has
//! moved, [`Graph::sync`] walks the cache's objects (reference-count bumps) and re-reads
//! only the pods whose cached object is not the one it last read (`CachedObject::ptr_eq`:
//! the cache replaces an object's handle on every event and keeps it otherwise). A pod
//! status write costs one re-read of that pod plus a walk of the handles (one key and one
//! pointer comparison per pod), an unchanged cache nothing. Memory is bounded by the pods
//! the cache holds: an entry leaves with its pod. PersistentVolumes follow their own cache
//! the same way ([`Graph::sync_volumes`]) when the apiserver serves them.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, EnvFromSource, EnvVar, PersistentVolume, PersistentVolumeSpec, Pod, Volume,
};
use serde::Deserialize;

use crate::watch_cache::object::CachedObject;

/// The kinds of object the graph relates to nodes: what a pod references by name in its own
/// namespace, the pod itself, and the (cluster-scoped) PersistentVolume bound to a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Secret,
    ConfigMap,
    PersistentVolumeClaim,
    ServiceAccount,
    Pod,
    PersistentVolume,
}

/// One PersistentVolume as the graph last read it.
struct VolumeEntry {
    /// The cached object it was read from (compared by pointer on the next sync).
    object: CachedObject,
    /// `spec.claimRef` (namespace, name); a volume without one adds no edge.
    claim: Option<(String, String)>,
    /// The kubelet-visible secrets it names, (namespace, name).
    secrets: Vec<(String, String)>,
}

/// One pod as the graph last read it.
struct PodEntry {
    /// The cached object it was read from (compared by pointer on the next sync).
    object: CachedObject,
    /// `spec.nodeName`; empty while the pod is unscheduled (then it adds no edge).
    node: String,
    namespace: String,
    references: Vec<(Kind, String)>,
}

/// The edges from referenced objects to the nodes whose pods reference them.
#[derive(Default)]
pub struct Graph {
    /// By the cache's key (`namespace/name`).
    pods: HashMap<String, PodEntry>,
    /// `(kind, namespace, name)` → node → how many of that node's pods reference it.
    edges: HashMap<(Kind, String, String), HashMap<String, u32>>,
    /// PersistentVolumes by name.
    volumes: HashMap<String, VolumeEntry>,
    /// (namespace, secret) → the names of the bound volumes that name it.
    volume_secrets: HashMap<(String, String), HashSet<String>>,
}

impl Graph {
    /// Whether `node` has a path to `kind` `namespace/name`: one of its pods references it,
    /// it is a pod bound to it, or (volumes and their secrets) it is reached through a
    /// volume bound to a claim one of its pods references.
    pub fn has_path(&self, node: &str, kind: Kind, namespace: &str, name: &str) -> bool {
        match kind {
            Kind::Pod => self
                .pods
                .get(&format!("{namespace}/{name}"))
                .is_some_and(|p| !p.node.is_empty() && p.node == node),
            Kind::PersistentVolume => namespace.is_empty() && self.volume_reaches(node, name),
            _ => {
                self.direct(node, kind, namespace, name)
                    || (kind == Kind::Secret
                        && self
                            .volume_secrets
                            .get(&(namespace.to_string(), name.to_string()))
                            .is_some_and(|volumes| {
                                volumes.iter().any(|v| self.volume_reaches(node, v))
                            }))
            }
        }
    }

    /// Whether one of `node`'s pods references `kind` `namespace/name` itself.
    fn direct(&self, node: &str, kind: Kind, namespace: &str, name: &str) -> bool {
        self.edges
            .get(&(kind, namespace.to_string(), name.to_string()))
            .is_some_and(|nodes| nodes.contains_key(node))
    }

    /// Whether volume `name` is bound to a claim one of `node`'s pods references.
    fn volume_reaches(&self, node: &str, name: &str) -> bool {
        self.volumes
            .get(name)
            .and_then(|v| v.claim.as_ref())
            .is_some_and(|(ns, claim)| self.direct(node, Kind::PersistentVolumeClaim, ns, claim))
    }

    /// PersistentVolumes held.
    pub fn volumes(&self) -> usize {
        self.volumes.len()
    }

    /// Brings the volumes to `items`, the PersistentVolumes' watch cache's objects, as
    /// [`Graph::sync`] does the pods.
    pub fn sync_volumes(&mut self, items: Vec<CachedObject>) {
        let mut seen = HashSet::with_capacity(items.len());
        for object in items {
            let name = object.name().to_string();
            let unchanged = self
                .volumes
                .get(&name)
                .is_some_and(|entry| entry.object.ptr_eq(&object));
            if !unchanged {
                self.set_volume(object);
            }
            seen.insert(name);
        }
        let gone: Vec<String> = self
            .volumes
            .keys()
            .filter(|k| !seen.contains(k.as_str()))
            .cloned()
            .collect();
        for name in gone {
            self.remove_volume(&name);
        }
    }

    /// Adds or replaces a PersistentVolume (upstream's `AddPV`: a volume without a
    /// `claimRef` has no edge, one with it an edge to its claim and from its secrets).
    pub fn set_volume(&mut self, object: CachedObject) {
        let name = object.name().to_string();
        self.remove_volume(&name);
        let (claim, secrets) = match PersistentVolume::deserialize(object.value()) {
            Ok(pv) => {
                let spec = pv.spec.unwrap_or_default();
                match spec.claim_ref.as_ref() {
                    Some(r) => {
                        let namespace = r.namespace.clone().unwrap_or_default();
                        let claim = r.name.clone().unwrap_or_default();
                        let secrets = volume_secret_names(&spec, &namespace);
                        (Some((namespace, claim)), secrets)
                    }
                    None => (None, Vec::new()),
                }
            }
            Err(e) => {
                tracing::warn!(volume = %name, error = %e, "node authorizer: a PersistentVolume that does not decode adds no edge");
                (None, Vec::new())
            }
        };
        for secret in &secrets {
            self.volume_secrets
                .entry(secret.clone())
                .or_default()
                .insert(name.clone());
        }
        self.volumes.insert(
            name,
            VolumeEntry {
                object,
                claim,
                secrets,
            },
        );
    }

    /// Removes PersistentVolume `name` and its edges.
    pub fn remove_volume(&mut self, name: &str) {
        let Some(entry) = self.volumes.remove(name) else {
            return;
        };
        for secret in entry.secrets {
            if let Some(volumes) = self.volume_secrets.get_mut(&secret) {
                volumes.remove(name);
                if volumes.is_empty() {
                    self.volume_secrets.remove(&secret);
                }
            }
        }
    }

    /// Pods held (for tests and metrics).
    pub fn pods(&self) -> usize {
        self.pods.len()
    }

    /// Referenced objects held.
    pub fn objects(&self) -> usize {
        self.edges.len()
    }

    /// Brings the graph to `items`, the pods' watch cache's objects: re-reads the pods whose
    /// object changed, drops those gone.
    pub fn sync(&mut self, items: Vec<CachedObject>) {
        let mut seen = HashSet::with_capacity(items.len());
        for object in items {
            let key = match object.namespace() {
                Some(ns) => format!("{ns}/{}", object.name()),
                None => object.name().to_string(),
            };
            let unchanged = self
                .pods
                .get(&key)
                .is_some_and(|entry| entry.object.ptr_eq(&object));
            if !unchanged {
                self.set_pod(key.clone(), object);
            }
            seen.insert(key);
        }
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|k| !seen.contains(k.as_str()))
            .cloned()
            .collect();
        for key in gone {
            self.remove_pod(&key);
        }
    }

    /// Adds or replaces the pod stored under `key`.
    pub fn set_pod(&mut self, key: String, object: CachedObject) {
        self.remove_pod(&key);
        let (node, references) = match Pod::deserialize(object.value()) {
            Ok(pod) => {
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                (node, pod_references(&pod))
            }
            Err(e) => {
                tracing::warn!(pod = %key, error = %e, "node authorizer: a pod that does not decode adds no edge");
                (String::new(), Vec::new())
            }
        };
        let namespace = object.namespace().unwrap_or_default().to_string();
        if !node.is_empty() {
            for (kind, name) in &references {
                *self
                    .edges
                    .entry((*kind, namespace.clone(), name.clone()))
                    .or_default()
                    .entry(node.clone())
                    .or_default() += 1;
            }
        }
        self.pods.insert(
            key,
            PodEntry {
                object,
                node,
                namespace,
                references,
            },
        );
    }

    /// Removes the pod stored under `key` and its edges.
    pub fn remove_pod(&mut self, key: &str) {
        let Some(entry) = self.pods.remove(key) else {
            return;
        };
        if entry.node.is_empty() {
            return;
        }
        for (kind, name) in entry.references {
            let edge = (kind, entry.namespace.clone(), name);
            let Some(nodes) = self.edges.get_mut(&edge) else {
                continue;
            };
            if let Some(count) = nodes.get_mut(&entry.node) {
                *count -= 1;
                if *count == 0 {
                    nodes.remove(&entry.node);
                }
            }
            if nodes.is_empty() {
                self.edges.remove(&edge);
            }
        }
    }
}

/// Every object `pod` references by name, each once: the secrets and configmaps Kubernetes'
/// `podutil.VisitPodSecretNames` / `VisitPodConfigmapNames` visit (image pull secrets, env,
/// envFrom, volumes, projected sources, the volume plugins' secret references, in every
/// container list), its claims (`persistentVolumeClaim` volumes and the claim an `ephemeral`
/// volume is given, `<pod>-<volume>`) and its service account.
pub fn pod_references(pod: &Pod) -> Vec<(Kind, String)> {
    let mut out: Vec<(Kind, String)> = Vec::new();
    let mut add = |kind: Kind, name: Option<&str>| {
        if let Some(name) = name.filter(|n| !n.is_empty())
            && !out.iter().any(|(k, n)| *k == kind && n == name)
        {
            out.push((kind, name.to_string()));
        }
    };
    let Some(spec) = &pod.spec else {
        return out;
    };
    for secret in spec.image_pull_secrets.iter().flatten() {
        add(Kind::Secret, Some(&secret.name));
    }
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| (c.env.as_deref(), c.env_from.as_deref()));
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c: &Container| (c.env.as_deref(), c.env_from.as_deref()));
    for (env, env_from) in containers.chain(ephemeral) {
        for from in env_from.unwrap_or_default() {
            let from: &EnvFromSource = from;
            add(
                Kind::Secret,
                from.secret_ref.as_ref().map(|r| r.name.as_str()),
            );
            add(
                Kind::ConfigMap,
                from.config_map_ref.as_ref().map(|r| r.name.as_str()),
            );
        }
        for var in env.unwrap_or_default() {
            let var: &EnvVar = var;
            let Some(source) = &var.value_from else {
                continue;
            };
            add(
                Kind::Secret,
                source.secret_key_ref.as_ref().map(|r| r.name.as_str()),
            );
            add(
                Kind::ConfigMap,
                source.config_map_key_ref.as_ref().map(|r| r.name.as_str()),
            );
        }
    }
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    for volume in spec.volumes.iter().flatten() {
        volume_references(volume, pod_name, &mut add);
    }
    add(Kind::ServiceAccount, spec.service_account_name.as_deref());
    out
}

fn volume_references(volume: &Volume, pod_name: &str, add: &mut impl FnMut(Kind, Option<&str>)) {
    let secret_ref = |r: &Option<k8s_openapi::api::core::v1::LocalObjectReference>| {
        r.as_ref().map(|r| r.name.clone())
    };
    if let Some(s) = &volume.secret {
        add(Kind::Secret, s.secret_name.as_deref());
    }
    if let Some(c) = &volume.config_map {
        add(Kind::ConfigMap, Some(&c.name));
    }
    if let Some(p) = &volume.projected {
        for source in p.sources.iter().flatten() {
            add(
                Kind::Secret,
                source.secret.as_ref().map(|s| s.name.as_str()),
            );
            add(
                Kind::ConfigMap,
                source.config_map.as_ref().map(|c| c.name.as_str()),
            );
        }
    }
    if let Some(a) = &volume.azure_file {
        add(Kind::Secret, Some(&a.secret_name));
    }
    let plugin_secrets = [
        volume
            .cephfs
            .as_ref()
            .and_then(|v| secret_ref(&v.secret_ref)),
        volume
            .cinder
            .as_ref()
            .and_then(|v| secret_ref(&v.secret_ref)),
        volume
            .flex_volume
            .as_ref()
            .and_then(|v| secret_ref(&v.secret_ref)),
        volume.rbd.as_ref().and_then(|v| secret_ref(&v.secret_ref)),
        volume.scale_io.as_ref().map(|v| v.secret_ref.name.clone()),
        volume
            .iscsi
            .as_ref()
            .and_then(|v| secret_ref(&v.secret_ref)),
        volume
            .storageos
            .as_ref()
            .and_then(|v| secret_ref(&v.secret_ref)),
        volume
            .csi
            .as_ref()
            .and_then(|v| secret_ref(&v.node_publish_secret_ref)),
    ];
    for name in plugin_secrets.iter().flatten() {
        add(Kind::Secret, Some(name));
    }
    if let Some(claim) = &volume.persistent_volume_claim {
        add(Kind::PersistentVolumeClaim, Some(&claim.claim_name));
    }
    if volume.ephemeral.is_some() {
        // The ephemeral volume controller's claim name (`ephemeral.VolumeClaimName`).
        add(
            Kind::PersistentVolumeClaim,
            Some(&format!("{pod_name}-{}", volume.name)),
        );
    }
}

/// The secrets a PersistentVolume names that the kubelet uses, each once, as
/// (namespace, name) (Kubernetes' `pkg/api/v1/persistentvolume/util.go`
/// `VisitPVSecretNames` with `kubeletVisible`): the secret reference of the one volume source
/// set, in its own namespace when it names one and otherwise in the bound claim's
/// (`claim_namespace`) for the sources upstream so defaults (azureFile, cephfs, flexVolume,
/// rbd, scaleIO, iscsi); CSI's node publish, stage and expand secrets. CSI's controller
/// publish and expand secrets are the controllers', not the kubelet's: no edge.
fn volume_secret_names(
    spec: &PersistentVolumeSpec,
    claim_namespace: &str,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut add = |namespace: Option<&str>, name: &str| {
        let namespace = namespace
            .filter(|n| !n.is_empty())
            .unwrap_or(claim_namespace)
            .to_string();
        if !name.is_empty() && !out.iter().any(|(ns, n)| *ns == namespace && n == name) {
            out.push((namespace, name.to_string()));
        }
    };
    if let Some(v) = &spec.azure_file {
        add(v.secret_namespace.as_deref(), &v.secret_name);
    } else if let Some(v) = &spec.cephfs {
        if let Some(r) = &v.secret_ref {
            add(
                r.namespace.as_deref(),
                r.name.as_deref().unwrap_or_default(),
            );
        }
    } else if let Some(v) = &spec.cinder {
        if let Some(r) = &v.secret_ref {
            push_exact(&mut out, r.namespace.as_deref(), r.name.as_deref());
        }
    } else if let Some(v) = &spec.flex_volume {
        if let Some(r) = &v.secret_ref {
            add(
                r.namespace.as_deref(),
                r.name.as_deref().unwrap_or_default(),
            );
        }
    } else if let Some(v) = &spec.rbd {
        if let Some(r) = &v.secret_ref {
            add(
                r.namespace.as_deref(),
                r.name.as_deref().unwrap_or_default(),
            );
        }
    } else if let Some(v) = &spec.scale_io {
        add(
            v.secret_ref.namespace.as_deref(),
            v.secret_ref.name.as_deref().unwrap_or_default(),
        );
    } else if let Some(v) = &spec.iscsi {
        if let Some(r) = &v.secret_ref {
            add(
                r.namespace.as_deref(),
                r.name.as_deref().unwrap_or_default(),
            );
        }
    } else if let Some(v) = &spec.storageos {
        if let Some(r) = &v.secret_ref {
            push_exact(&mut out, r.namespace.as_deref(), r.name.as_deref());
        }
    } else if let Some(v) = &spec.csi {
        for r in [
            &v.node_publish_secret_ref,
            &v.node_stage_secret_ref,
            &v.node_expand_secret_ref,
        ]
        .into_iter()
        .flatten()
        {
            push_exact(&mut out, r.namespace.as_deref(), r.name.as_deref());
        }
    }
    out
}

/// Adds a secret reference taken with its namespace as written, each once: Cinder,
/// StorageOS and CSI do not fall back to the claim's namespace, so an empty one stays empty
/// and is reachable by no namespaced get.
fn push_exact(out: &mut Vec<(String, String)>, namespace: Option<&str>, name: Option<&str>) {
    let namespace = namespace.unwrap_or_default();
    let name = name.unwrap_or_default();
    if !name.is_empty() && !out.iter().any(|(ns, n)| ns == namespace && n == name) {
        out.push((namespace.to_string(), name.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cached(value: serde_json::Value) -> CachedObject {
        CachedObject::new(value, None)
    }

    fn pod(name: &str, node: &str, secret: &str) -> serde_json::Value {
        json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "default",
                "imagePullSecrets": [{"name": "pull"}],
                "containers": [{"name": "c", "image": "i",
                    "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "envcm", "key": "k"}}}],
                    "envFrom": [{"secretRef": {"name": "envsecret"}}]}],
                "volumes": [
                    {"name": "s", "secret": {"secretName": secret}},
                    {"name": "p", "projected": {"sources": [{"configMap": {"name": "projcm"}}]}},
                    {"name": "c", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "e", "ephemeral": {}},
                    {"name": "csi", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csisecret"}}}
                ]
            }
        })
    }

    #[test]
    fn every_reference_of_a_pod_is_an_edge_to_its_node() {
        let mut g = Graph::default();
        g.sync(vec![cached(pod("p", "a", "mounted"))]);
        for (kind, name) in [
            (Kind::Secret, "mounted"),
            (Kind::Secret, "pull"),
            (Kind::Secret, "envsecret"),
            (Kind::Secret, "csisecret"),
            (Kind::ConfigMap, "envcm"),
            (Kind::ConfigMap, "projcm"),
            (Kind::PersistentVolumeClaim, "data"),
            (Kind::PersistentVolumeClaim, "p-e"),
            (Kind::ServiceAccount, "default"),
        ] {
            assert!(g.has_path("a", kind, "default", name), "{kind:?} {name}");
            assert!(!g.has_path("b", kind, "default", name), "{kind:?} {name}");
            assert!(!g.has_path("a", kind, "other", name), "{kind:?} {name}");
        }
        // A name is not a path for another kind.
        assert!(!g.has_path("a", Kind::ConfigMap, "default", "mounted"));
    }

    #[test]
    fn unscheduled_pods_add_no_edge_and_deleted_pods_take_theirs_away() {
        let mut g = Graph::default();
        let unscheduled = cached(pod("u", "", "s"));
        g.sync(vec![unscheduled.clone()]);
        assert!(!g.has_path("a", Kind::Secret, "default", "s"));
        assert_eq!(g.objects(), 0);
        // Scheduled: a new cached object.
        let scheduled = cached(pod("u", "a", "s"));
        let other = cached(pod("v", "a", "s"));
        g.sync(vec![scheduled.clone(), other.clone()]);
        assert!(g.has_path("a", Kind::Secret, "default", "s"));
        // One of the two pods goes: the edge stays, counted by the other.
        g.sync(vec![other]);
        assert!(g.has_path("a", Kind::Secret, "default", "s"));
        assert_eq!(g.pods(), 1);
        g.sync(Vec::new());
        assert!(!g.has_path("a", Kind::Secret, "default", "s"));
        assert_eq!((g.pods(), g.objects()), (0, 0), "nothing outlives its pod");
    }

    #[test]
    fn a_pod_moving_its_reference_moves_the_edge() {
        let mut g = Graph::default();
        g.sync(vec![cached(pod("p", "a", "old"))]);
        g.sync(vec![cached(pod("p", "a", "new"))]);
        assert!(g.has_path("a", Kind::Secret, "default", "new"));
        assert!(!g.has_path("a", Kind::Secret, "default", "old"));
    }

    #[test]
    fn an_unchanged_cached_object_is_not_read_again() {
        let mut g = Graph::default();
        let object = cached(pod("p", "a", "s"));
        g.sync(vec![object.clone()]);
        // Pretend the entry was read from something else: a sync with the same handle
        // must keep it, proving it compared pointers rather than re-reading.
        g.pods.get_mut("default/p").expect("held").node = "marker".into();
        g.sync(vec![object]);
        assert_eq!(g.pods["default/p"].node, "marker");
    }

    fn volume(name: &str, claim: Option<(&str, &str)>, source: serde_json::Value) -> CachedObject {
        let mut spec = source;
        if let Some((ns, c)) = claim {
            spec["claimRef"] = json!({"kind": "PersistentVolumeClaim", "namespace": ns, "name": c});
        }
        cached(json!({"metadata": {"name": name}, "spec": spec}))
    }

    #[test]
    fn a_volume_bound_to_a_claim_of_its_pods_and_the_volume_s_secrets_reach_the_node() {
        let mut g = Graph::default();
        // The pod (on node a) references claim default/data.
        g.sync(vec![cached(pod("p", "a", "s"))]);
        g.sync_volumes(vec![
            volume(
                "pv-data",
                Some(("default", "data")),
                json!({"csi": {"driver": "d", "volumeHandle": "h",
                    "nodePublishSecretRef": {"name": "publish", "namespace": "storage"},
                    "nodeStageSecretRef": {"name": "stage", "namespace": "storage"},
                    "nodeExpandSecretRef": {"name": "expand", "namespace": "storage"},
                    "controllerPublishSecretRef": {"name": "controller", "namespace": "storage"},
                    "controllerExpandSecretRef": {"name": "cexpand", "namespace": "storage"}}}),
            ),
            // Bound to a claim no pod of a's references.
            volume(
                "pv-other",
                Some(("default", "other")),
                json!({"rbd": {"monitors": ["m"], "image": "i", "secretRef": {"name": "rbd"}}}),
            ),
            // Not bound at all: no edge, even naming the same secret.
            volume(
                "pv-free",
                None,
                json!({"csi": {"driver": "d", "volumeHandle": "h",
                    "nodePublishSecretRef": {"name": "publish", "namespace": "storage"}}}),
            ),
        ]);
        assert_eq!(g.volumes(), 3);
        assert!(g.has_path("a", Kind::PersistentVolume, "", "pv-data"));
        assert!(!g.has_path("b", Kind::PersistentVolume, "", "pv-data"));
        assert!(!g.has_path("a", Kind::PersistentVolume, "", "pv-other"));
        assert!(!g.has_path("a", Kind::PersistentVolume, "", "pv-free"));
        // A volume is cluster-scoped: a namespaced name is not it.
        assert!(!g.has_path("a", Kind::PersistentVolume, "default", "pv-data"));
        for secret in ["publish", "stage", "expand"] {
            assert!(g.has_path("a", Kind::Secret, "storage", secret), "{secret}");
            assert!(
                !g.has_path("b", Kind::Secret, "storage", secret),
                "{secret}"
            );
            assert!(
                !g.has_path("a", Kind::Secret, "default", secret),
                "{secret}"
            );
        }
        // The controllers' secrets are not the kubelet's.
        assert!(!g.has_path("a", Kind::Secret, "storage", "controller"));
        assert!(!g.has_path("a", Kind::Secret, "storage", "cexpand"));
        // A volume's secret is not a configmap.
        assert!(!g.has_path("a", Kind::ConfigMap, "storage", "publish"));

        // The volume is rebound to another claim: its path moves with it.
        g.sync_volumes(vec![volume(
            "pv-data",
            Some(("default", "elsewhere")),
            json!({"csi": {"driver": "d", "volumeHandle": "h",
                "nodePublishSecretRef": {"name": "publish", "namespace": "storage"}}}),
        )]);
        assert!(!g.has_path("a", Kind::PersistentVolume, "", "pv-data"));
        assert!(!g.has_path("a", Kind::Secret, "storage", "publish"));
        // The pod goes: nothing is reachable through its claim any more.
        g.sync_volumes(vec![volume(
            "pv-data",
            Some(("default", "data")),
            json!({"csi": {"driver": "d", "volumeHandle": "h",
                "nodePublishSecretRef": {"name": "publish", "namespace": "storage"}}}),
        )]);
        assert!(g.has_path("a", Kind::Secret, "storage", "publish"));
        g.sync(Vec::new());
        assert!(!g.has_path("a", Kind::PersistentVolume, "", "pv-data"));
        assert!(!g.has_path("a", Kind::Secret, "storage", "publish"));
        g.sync_volumes(Vec::new());
        assert_eq!((g.volumes(), g.volume_secrets.len()), (0, 0));
    }

    #[test]
    fn plugin_secrets_default_to_the_claim_s_namespace_as_upstream_s_visitor() {
        let cases = [
            (
                json!({"azureFile": {"secretName": "az", "shareName": "s"}}),
                "team",
                "az",
            ),
            (
                json!({"azureFile": {"secretName": "az", "shareName": "s", "secretNamespace": "x"}}),
                "x",
                "az",
            ),
            (
                json!({"cephfs": {"monitors": ["m"], "secretRef": {"name": "ceph"}}}),
                "team",
                "ceph",
            ),
            (
                json!({"cephfs": {"monitors": ["m"], "secretRef": {"name": "ceph", "namespace": "x"}}}),
                "x",
                "ceph",
            ),
            (
                json!({"flexVolume": {"driver": "d", "secretRef": {"name": "flex"}}}),
                "team",
                "flex",
            ),
            (
                json!({"rbd": {"monitors": ["m"], "image": "i", "secretRef": {"name": "rbd"}}}),
                "team",
                "rbd",
            ),
            (
                json!({"scaleIO": {"gateway": "g", "system": "s", "secretRef": {"name": "sio"}}}),
                "team",
                "sio",
            ),
            (
                json!({"iscsi": {"targetPortal": "t", "iqn": "q", "lun": 0, "secretRef": {"name": "iscsi"}}}),
                "team",
                "iscsi",
            ),
            (
                json!({"cinder": {"volumeID": "v", "secretRef": {"name": "cinder", "namespace": "x"}}}),
                "x",
                "cinder",
            ),
            (
                json!({"storageos": {"volumeName": "v", "secretRef": {"name": "sos", "namespace": "x"}}}),
                "x",
                "sos",
            ),
        ];
        for (source, namespace, secret) in cases {
            let mut g = Graph::default();
            g.sync(vec![cached(json!({
                "metadata": {"name": "p", "namespace": "team"},
                "spec": {"nodeName": "a", "containers": [],
                         "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}
            }))]);
            g.sync_volumes(vec![volume("pv", Some(("team", "c")), source.clone())]);
            assert!(g.has_path("a", Kind::Secret, namespace, secret), "{source}");
            assert!(
                !g.has_path("b", Kind::Secret, namespace, secret),
                "{source}"
            );
        }
        // Cinder without a namespace does not fall back to the claim's.
        let mut g = Graph::default();
        g.sync(vec![cached(pod("p", "a", "s"))]);
        g.sync_volumes(vec![volume(
            "pv",
            Some(("default", "data")),
            json!({"cinder": {"volumeID": "v", "secretRef": {"name": "cinder"}}}),
        )]);
        assert!(!g.has_path("a", Kind::Secret, "default", "cinder"));
    }

    #[test]
    fn a_pod_reaches_only_its_own_node() {
        let mut g = Graph::default();
        g.sync(vec![cached(pod("p", "a", "s")), cached(pod("u", "", "s"))]);
        assert!(g.has_path("a", Kind::Pod, "default", "p"));
        assert!(!g.has_path("b", Kind::Pod, "default", "p"));
        assert!(!g.has_path("a", Kind::Pod, "other", "p"));
        // Unscheduled: no node's, not even the empty name's.
        assert!(!g.has_path("", Kind::Pod, "default", "u"));
    }

    /// The graph's cost at 5,000 pods (printed; `ARCHITECTURE.md` quotes it): the first full
    /// read, and a sync after one pod's status write. Both must stay far under a second even
    /// on a debug build, or every node's first decision stalls the apiserver.
    #[test]
    fn five_thousand_pods_read_once_then_one_re_read() {
        const PODS: usize = 5_000;
        let objects: Vec<CachedObject> = (0..PODS)
            .map(|i| {
                cached(pod(
                    &format!("p{i}"),
                    &format!("n{}", i % 3),
                    &format!("s{i}"),
                ))
            })
            .collect();
        let mut g = Graph::default();
        let start = std::time::Instant::now();
        g.sync(objects.clone());
        let first = start.elapsed();
        let mut moved = objects;
        moved[7] = cached(pod("p7", "n1", "moved"));
        let start = std::time::Instant::now();
        g.sync(moved);
        let again = start.elapsed();
        println!("5,000 pods: first read {first:?}, after one write {again:?}");
        assert_eq!(g.pods(), PODS);
        assert!(g.has_path("n1", Kind::Secret, "default", "moved"));
        assert!(!g.has_path("n1", Kind::Secret, "default", "s7"));
        assert!(g.has_path("n0", Kind::Secret, "default", "s3"));
        assert!(first < std::time::Duration::from_secs(5), "{first:?}");
        assert!(again < std::time::Duration::from_secs(1), "{again:?}");
    }
}
