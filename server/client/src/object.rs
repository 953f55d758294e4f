//! What the client library asks of an object: Kubernetes metadata, serde, and cheap sharing.
//!
//! [`Object`] is implemented for every `k8s-openapi` type with `ObjectMeta` and for
//! [`PartialObjectMetadata`] (the metadata-only view the garbage collector reads). Typed
//! requests additionally need `k8s_openapi::Resource` for the URL; metadata requests name
//! their resource with an [`ApiResource`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// An object the reflector, the caches and the informer can carry.
pub trait Object:
    k8s_openapi::Metadata<Ty = ObjectMeta>
    + Clone
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + std::fmt::Debug
    + 'static
{
}

impl<T> Object for T where
    T: k8s_openapi::Metadata<Ty = ObjectMeta>
        + Clone
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + std::fmt::Debug
        + 'static
{
}

/// client-go's `MetaNamespaceKeyFunc`: `namespace/name`, or `name` for cluster-scoped objects.
pub fn key_of<K: Object>(obj: &K) -> String {
    let meta = obj.metadata();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// `meta.k8s.io/v1` PartialObjectMetadata: an object reduced to its type and metadata, as the
/// apiserver answers `Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialObjectMetadata {
    /// The object's own apiVersion (e.g. `apps/v1`).
    #[serde(default)]
    pub api_version: String,
    /// The object's own kind (e.g. `ReplicaSet`).
    #[serde(default)]
    pub kind: String,
    /// The metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
}

/// Needed by `k8s_openapi::Metadata`; the URL comes from an [`ApiResource`], never from here.
impl k8s_openapi::Resource for PartialObjectMetadata {
    const API_VERSION: &'static str = "meta.k8s.io/v1";
    const GROUP: &'static str = "meta.k8s.io";
    const KIND: &'static str = "PartialObjectMetadata";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "";
    type Scope = k8s_openapi::SubResourceScope;
}

impl k8s_openapi::Metadata for PartialObjectMetadata {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A resource named at run time (group, version, plural, kind, scope), for the metadata
/// client and for anything that discovers resources instead of naming a Rust type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ApiResource {
    /// API group; empty for the core group.
    pub group: String,
    /// Version, e.g. `v1`.
    pub version: String,
    /// Plural resource name, e.g. `replicasets`.
    pub plural: String,
    /// Kind, e.g. `ReplicaSet`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

impl ApiResource {
    /// The resource of a `k8s-openapi` type.
    pub fn of<K: k8s_openapi::Resource>() -> ApiResource {
        ApiResource {
            group: K::GROUP.to_string(),
            version: K::VERSION.to_string(),
            plural: K::URL_PATH_SEGMENT.to_string(),
            kind: K::KIND.to_string(),
            namespaced: std::any::type_name::<K::Scope>().ends_with("NamespaceResourceScope"),
        }
    }

    /// `apps/v1` or `v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The collection path: `/api/v1/namespaces/{ns}/pods`, `/apis/apps/v1/replicasets`
    /// (all namespaces when `namespace` is `None`), `/api/v1/nodes`.
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        let root = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match namespace {
            Some(ns) if self.namespaced => format!("{root}/namespaces/{ns}/{}", self.plural),
            _ => format!("{root}/{}", self.plural),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::core::v1::{Node, Pod};

    #[test]
    fn resource_paths() {
        let rs = ApiResource::of::<ReplicaSet>();
        assert!(rs.namespaced);
        assert_eq!(
            rs.collection_path(Some("default")),
            "/apis/apps/v1/namespaces/default/replicasets"
        );
        assert_eq!(rs.collection_path(None), "/apis/apps/v1/replicasets");
        let nodes = ApiResource::of::<Node>();
        assert!(!nodes.namespaced);
        assert_eq!(nodes.collection_path(Some("x")), "/api/v1/nodes");
        assert_eq!(ApiResource::of::<Pod>().api_version(), "v1");
    }

    #[test]
    fn keys() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("a".into());
        assert_eq!(key_of(&pod), "a");
        pod.metadata.namespace = Some("ns".into());
        assert_eq!(key_of(&pod), "ns/a");
    }
}
