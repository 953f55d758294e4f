//! The root CA publisher (kube-controller-manager's
//! `pkg/controller/certificates/rootcacertpublisher`, `Publisher`): every active namespace has
//! the ConfigMap `kube-root-ca.crt` whose `ca.crt` is the cluster CA's PEM, so a pod verifies
//! the apiserver with what the ServiceAccount admission mounts at
//! `/var/run/secrets/kubernetes.io/serviceaccount/ca.crt`.
//!
//! Level-triggered, keyed by namespace name: a namespace added (or updated while `Active`,
//! including every resync) and a `kube-root-ca.crt` updated or deleted each queue the
//! namespace; [`sync`] creates the ConfigMap when the cache has none, and rewrites it when its
//! data or its description annotation differ — an edit is undone, a deletion repaired.
//!
//! Acting on a cache that lags (`docs/tricks.md`, part 5): a create that finds the ConfigMap
//! already there (`AlreadyExists`) is an error that re-queues the key, so the next sync reads
//! the object the cache will by then hold and checks its content; a create refused because the
//! namespace is gone or terminating is not retried.
//!
//! [`sync`]: RootCaCertPublisher::sync_namespace

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use skerry_client::cache::Indexer;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, PostParams};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::podcontrol::is_namespace_terminating;
use crate::runtime::{self, Reconciler};

/// The ConfigMap's name (upstream `RootCACertConfigMapName`); the ServiceAccount admission's
/// projected volume reads it.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
/// The key holding the CA bundle (what the projected volume's item names).
pub const ROOT_CA_KEY: &str = "ca.crt";
/// The annotation describing the ConfigMap (upstream `DescriptionAnnotation`).
pub const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
/// Its value, upstream's `Description` word for word: tools compare it.
pub const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// Workers: kube-controller-manager starts the publisher with 1 (`startRootCACertPublisher`).
/// A sync is a cache lookup and at most one write.
pub const DEFAULT_WORKERS: usize = 1;

/// The namespace phase in which the ConfigMap is kept.
const PHASE_ACTIVE: &str = "Active";

fn is_active(namespace: &Namespace) -> bool {
    namespace.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(PHASE_ACTIVE)
}

/// The ConfigMap's data for `root_ca`.
fn desired_data(root_ca: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(ROOT_CA_KEY.to_string(), root_ca.to_string())])
}

/// The ConfigMap created in `namespace`.
pub fn config_map(namespace: &str, root_ca: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(ROOT_CA_CONFIG_MAP.to_string()),
            namespace: Some(namespace.to_string()),
            annotations: Some(BTreeMap::from([(
                DESCRIPTION_ANNOTATION.to_string(),
                DESCRIPTION.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(desired_data(root_ca)),
        ..ConfigMap::default()
    }
}

/// The existing ConfigMap corrected, or `None` when it is right: its data exactly
/// `{ca.crt: root_ca}` and a non-empty description annotation (upstream keeps a description
/// someone rewrote, and only restores a missing one). Other annotations and labels are kept.
pub fn corrected(existing: &ConfigMap, root_ca: &str) -> Option<ConfigMap> {
    let data = desired_data(root_ca);
    let described = existing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
        .is_some_and(|d| !d.is_empty());
    if existing.data.as_ref() == Some(&data) && described {
        return None;
    }
    let mut fixed = existing.clone();
    fixed.data = Some(data);
    fixed.binary_data = None;
    fixed
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(DESCRIPTION_ANNOTATION.to_string(), DESCRIPTION.to_string());
    Some(fixed)
}

/// The root CA publisher. Build it with [`RootCaCertPublisher::new`], then run it with
/// [`RootCaCertPublisher::run`] once the informers are started.
pub struct RootCaCertPublisher {
    client: Client,
    root_ca: String,
    namespaces: Indexer<Namespace>,
    config_maps: Indexer<ConfigMap>,
    queue: WorkQueue<String>,
    informers: (SharedInformer<Namespace>, SharedInformer<ConfigMap>),
}

impl RootCaCertPublisher {
    /// A publisher of `root_ca` (PEM) over the context's shared Namespace and ConfigMap
    /// informers, with its handlers registered.
    pub fn new(ctx: &Context, root_ca: String) -> Arc<RootCaCertPublisher> {
        let ns_informer = ctx.informers.informer::<Namespace>();
        let cm_informer = ctx.informers.informer::<ConfigMap>();
        let controller = Arc::new(RootCaCertPublisher {
            client: ctx.client.clone(),
            root_ca,
            namespaces: ns_informer.store(),
            config_maps: cm_informer.store(),
            queue: WorkQueue::new("root_ca_cert_publisher"),
            informers: (ns_informer.clone(), cm_informer.clone()),
        });
        ns_informer.add_handler(NamespaceHandler(Arc::downgrade(&controller)));
        cm_informer.add_handler(ConfigMapHandler(Arc::downgrade(&controller)));
        controller
    }

    /// The controller's work queue of namespace names.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Waits for the informers' first lists, then runs `workers` workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        let (namespaces, config_maps) = &self.informers;
        if !namespaces.wait_for_sync(&stop).await || !config_maps.wait_for_sync(&stop).await {
            tracing::info!("root CA cert publisher stopped before its caches synced");
            return;
        }
        tracing::info!(workers, "starting root CA cert publisher");
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
    }

    /// Creates or corrects `kube-root-ca.crt` in the namespace `name`.
    pub async fn sync_namespace(&self, name: &str) -> anyhow::Result<()> {
        match self.namespaces.get(name) {
            Some(ns) if is_active(&ns) => {}
            // Gone or being emptied: the namespace controller deletes what is in it.
            _ => return Ok(()),
        }
        let api = self.client.api::<ConfigMap>(Some(name));
        match self.config_maps.get_by(name, ROOT_CA_CONFIG_MAP) {
            None => match api
                .create(&PostParams::default(), &config_map(name, &self.root_ca))
                .await
            {
                Ok(_) => {
                    tracing::debug!(namespace = name, "published the root CA");
                    Ok(())
                }
                // Don't retry a create in a namespace that is gone or terminating.
                Err(e) if e.is_not_found() || is_namespace_terminating(&e) => Ok(()),
                // AlreadyExists included: the cache was late; the retry checks the content.
                Err(e) => Err(anyhow::anyhow!("creating {name}/{ROOT_CA_CONFIG_MAP}: {e}")),
            },
            Some(existing) => {
                let Some(fixed) = corrected(&existing, &self.root_ca) else {
                    return Ok(());
                };
                api.replace(ROOT_CA_CONFIG_MAP, &PostParams::default(), &fixed)
                    .await
                    .map(|_| tracing::debug!(namespace = name, "restored the root CA"))
                    // A conflict re-queues: the next sync reads the newer object.
                    .map_err(|e| anyhow::anyhow!("updating {name}/{ROOT_CA_CONFIG_MAP}: {e}"))
            }
        }
    }
}

impl Reconciler for RootCaCertPublisher {
    fn name(&self) -> &'static str {
        "root-ca-cert-publisher"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        self.sync_namespace(key).await
    }
}

/// Queues every added namespace and every active one updated (upstream `namespaceAdded`,
/// `namespaceUpdated`). Holds the controller weakly: the informer outlives it.
struct NamespaceHandler(Weak<RootCaCertPublisher>);

impl EventHandler<Namespace> for NamespaceHandler {
    fn on_add(&self, obj: &Arc<Namespace>, _is_initial_list: bool) {
        if let (Some(c), Some(name)) = (self.0.upgrade(), obj.metadata.name.as_ref()) {
            c.queue.add(name.clone());
        }
    }
    fn on_update(&self, _old: &Arc<Namespace>, new: &Arc<Namespace>) {
        if !is_active(new) {
            return;
        }
        if let (Some(c), Some(name)) = (self.0.upgrade(), new.metadata.name.as_ref()) {
            c.queue.add(name.clone());
        }
    }
    fn on_delete(&self, _obj: &Deleted<Namespace>) {}
}

/// Queues the namespace of an updated or deleted `kube-root-ca.crt` (tombstones included), so
/// an edit is undone and a deletion repaired (upstream `configMapUpdated`, `configMapDeleted`).
struct ConfigMapHandler(Weak<RootCaCertPublisher>);

impl ConfigMapHandler {
    fn queue(&self, cm: &ConfigMap) {
        if cm.metadata.name.as_deref() != Some(ROOT_CA_CONFIG_MAP) {
            return;
        }
        if let (Some(c), Some(namespace)) = (self.0.upgrade(), cm.metadata.namespace.as_ref()) {
            c.queue.add(namespace.clone());
        }
    }
}

impl EventHandler<ConfigMap> for ConfigMapHandler {
    fn on_add(&self, _obj: &Arc<ConfigMap>, _is_initial_list: bool) {}
    fn on_update(&self, _old: &Arc<ConfigMap>, new: &Arc<ConfigMap>) {
        self.queue(new);
    }
    fn on_delete(&self, obj: &Deleted<ConfigMap>) {
        self.queue(obj.object());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn the_created_config_map_is_upstreams() {
        let cm = config_map("team-a", CA);
        assert_eq!(cm.metadata.name.as_deref(), Some("kube-root-ca.crt"));
        assert_eq!(cm.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(cm.data, Some(desired_data(CA)));
        assert_eq!(
            cm.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/description"))
                .map(String::as_str),
            Some(DESCRIPTION)
        );
        assert!(
            corrected(&cm, CA).is_none(),
            "what it creates needs no correction"
        );
    }

    #[test]
    fn an_edit_is_undone_and_other_metadata_kept() {
        let mut edited = config_map("team-a", CA);
        edited.data = Some(BTreeMap::from([
            ("ca.crt".to_string(), "not a CA".to_string()),
            ("extra".to_string(), "x".to_string()),
        ]));
        edited.metadata.labels = Some(BTreeMap::from([("mine".to_string(), "1".to_string())]));
        let fixed = corrected(&edited, CA).expect("the data differs");
        assert_eq!(fixed.data, Some(desired_data(CA)));
        assert_eq!(fixed.metadata.labels, edited.metadata.labels);

        let mut undescribed = config_map("team-a", CA);
        undescribed.metadata.annotations = None;
        let fixed = corrected(&undescribed, CA).expect("the annotation is missing");
        assert_eq!(
            fixed
                .metadata
                .annotations
                .and_then(|a| a.get(DESCRIPTION_ANNOTATION).cloned())
                .as_deref(),
            Some(DESCRIPTION)
        );

        // A rewritten (non-empty) description is left, as upstream leaves it.
        let mut redescribed = config_map("team-a", CA);
        redescribed.metadata.annotations = Some(BTreeMap::from([(
            DESCRIPTION_ANNOTATION.to_string(),
            "ours".to_string(),
        )]));
        assert!(corrected(&redescribed, CA).is_none());
    }
}
