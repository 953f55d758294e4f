//! The Node authorizer's graph: which secrets, configmaps, persistentvolumeclaims and service
//! accounts each node's pods reference (Kubernetes'
//! `plugin/pkg/auth/authorizer/node/graph.go` and `graph_populator.go`).
//!
//! Upstream keeps a general vertex/edge graph fed by informers. The relations a pod creates
//! are all one hop long here (pod → object in the pod's namespace; PersistentVolumes are not
//! served, so the `pvc → pv` hop does not exist), so the graph is kept as two maps: each
//! pod's node and references, and, per referenced object, how many pods of each node
//! reference it. "Has node N a path to secret ns/s" is one lookup.
//!
//! The trick: the graph follows the pods' watch cache, which the apiserver already keeps,
//! without a watch of its own. When a decision needs it and the cache's resourceVersion has
//! moved, [`Graph::sync`] walks the cache's objects (reference-count bumps) and re-reads
//! only the pods whose cached object is not the one it last read (`CachedObject::ptr_eq`:
//! the cache replaces an object's handle on every event and keeps it otherwise). A pod
//! status write costs one re-read of that pod plus a walk of the handles (one key and one
//! pointer comparison per pod), an unchanged cache nothing. Memory is bounded by the pods
//! the cache holds: an entry leaves with its pod.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, Pod, Volume};
use serde::Deserialize;

use crate::watch_cache::object::CachedObject;

/// What a pod references by name, in its own namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Secret,
    ConfigMap,
    PersistentVolumeClaim,
    ServiceAccount,
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
}

impl Graph {
    /// Whether one of `node`'s pods references `kind` `namespace/name`.
    pub fn has_path(&self, node: &str, kind: Kind, namespace: &str, name: &str) -> bool {
        self.edges
            .get(&(kind, namespace.to_string(), name.to_string()))
            .is_some_and(|nodes| nodes.contains_key(node))
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
}
