//! The service-account controller (kube-controller-manager's
//! `pkg/controller/serviceaccount`, `ServiceAccountsController`): every active namespace has a
//! `default` ServiceAccount, the identity its pods run as when they name none.
//!
//! Level-triggered, keyed by namespace name: a namespace added or updated (including every
//! resync) and a ServiceAccount deleted each queue the namespace, and [`sync`] creates what is
//! missing. A namespace that is not `Active` gets nothing — it is being emptied by the
//! namespace controller, and the apiserver refuses new content in it anyway.
//!
//! Acting on a cache that lags (`docs/tricks.md`, part 5): the decision reads the ServiceAccount
//! cache, which can be behind the store, so a create may find the account already there. That
//! `AlreadyExists` is success, never an error: the cache was late, not the cluster wrong.
//!
//! [`sync`]: ServiceAccountController::sync_namespace

use std::sync::{Arc, Weak};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use skerry_client::cache::Indexer;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, PostParams};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::podcontrol::is_namespace_terminating;
use crate::runtime::{self, Reconciler};

/// The ServiceAccounts ensured in every active namespace (Kubernetes'
/// `DefaultServiceAccountsControllerOptions`: just `default`).
pub const SERVICE_ACCOUNTS_TO_ENSURE: &[&str] = &["default"];

/// Workers: kube-controller-manager starts this controller with one. A sync is a cache
/// lookup and, rarely, one create; one worker keeps up with any namespace churn a three-box
/// cluster sees.
pub const DEFAULT_WORKERS: usize = 1;

/// The namespace phase in which accounts are ensured.
const PHASE_ACTIVE: &str = "Active";

/// The accounts `namespace` lacks, given which ones the cache has (`exists`): all of
/// [`SERVICE_ACCOUNTS_TO_ENSURE`] that are missing when the namespace is `Active`, none
/// otherwise (Kubernetes' `syncNamespace`).
pub fn missing_accounts(namespace: &Namespace, exists: impl Fn(&str) -> bool) -> Vec<&'static str> {
    let phase = namespace.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some(PHASE_ACTIVE) {
        return Vec::new();
    }
    SERVICE_ACCOUNTS_TO_ENSURE
        .iter()
        .copied()
        .filter(|name| !exists(name))
        .collect()
}

/// The ServiceAccount created for `name` in `namespace`.
pub fn service_account(namespace: &str, name: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    }
}

/// The service-account controller. Build it with [`ServiceAccountController::new`], then
/// run it with [`ServiceAccountController::run`] once the informers are started.
pub struct ServiceAccountController {
    client: Client,
    namespaces: Indexer<Namespace>,
    service_accounts: Indexer<ServiceAccount>,
    queue: WorkQueue<String>,
    informers: (SharedInformer<Namespace>, SharedInformer<ServiceAccount>),
}

impl ServiceAccountController {
    /// A controller over the context's shared Namespace and ServiceAccount informers, with
    /// its handlers registered.
    pub fn new(ctx: &Context) -> Arc<ServiceAccountController> {
        let ns_informer = ctx.informers.informer::<Namespace>();
        let sa_informer = ctx.informers.informer::<ServiceAccount>();
        let controller = Arc::new(ServiceAccountController {
            client: ctx.client.clone(),
            namespaces: ns_informer.store(),
            service_accounts: sa_informer.store(),
            queue: WorkQueue::new("serviceaccount"),
            informers: (ns_informer.clone(), sa_informer.clone()),
        });
        ns_informer.add_handler(NamespaceHandler(Arc::downgrade(&controller)));
        sa_informer.add_handler(ServiceAccountHandler(Arc::downgrade(&controller)));
        controller
    }

    /// The controller's work queue of namespace names.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Waits for the informers' first lists, then runs `workers` workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        let (namespaces, service_accounts) = &self.informers;
        if !namespaces.wait_for_sync(&stop).await || !service_accounts.wait_for_sync(&stop).await {
            tracing::info!("serviceaccount controller stopped before its caches synced");
            return;
        }
        tracing::info!(workers, "starting serviceaccount controller");
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
    }

    /// Creates the accounts the namespace `name` lacks. A namespace gone from the cache, or
    /// not active, needs nothing; an account that already exists, or a namespace that turned
    /// out to be terminating, is not a failure.
    pub async fn sync_namespace(&self, name: &str) -> anyhow::Result<()> {
        let Some(namespace) = self.namespaces.get(name) else {
            return Ok(());
        };
        let missing = missing_accounts(&namespace, |sa| {
            self.service_accounts.get_by(name, sa).is_some()
        });
        let api = self.client.api::<ServiceAccount>(Some(name));
        let mut failures = Vec::new();
        for sa in missing {
            match api
                .create(&PostParams::default(), &service_account(name, sa))
                .await
            {
                Ok(_) => tracing::debug!(namespace = name, service_account = sa, "created"),
                // The cache was behind the store: the account is there.
                Err(e) if e.is_already_exists() => {}
                // The namespace started terminating after the cache saw it: nothing to do.
                Err(e) if is_namespace_terminating(&e) => {}
                Err(e) => failures.push(format!("creating service account {name}/{sa}: {e}")),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(anyhow::anyhow!(failures.join("; ")))
        }
    }
}

impl Reconciler for ServiceAccountController {
    fn name(&self) -> &'static str {
        "serviceaccount"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        self.sync_namespace(key).await
    }
}

/// Queues every added or updated namespace. Holds the controller weakly: the informer
/// outlives it.
struct NamespaceHandler(Weak<ServiceAccountController>);

impl EventHandler<Namespace> for NamespaceHandler {
    fn on_add(&self, obj: &Arc<Namespace>, _is_initial_list: bool) {
        if let (Some(c), Some(name)) = (self.0.upgrade(), obj.metadata.name.as_ref()) {
            c.queue.add(name.clone());
        }
    }
    fn on_update(&self, _old: &Arc<Namespace>, new: &Arc<Namespace>) {
        if let (Some(c), Some(name)) = (self.0.upgrade(), new.metadata.name.as_ref()) {
            c.queue.add(name.clone());
        }
    }
    fn on_delete(&self, _obj: &Deleted<Namespace>) {}
}

/// Queues the namespace of a deleted ServiceAccount, so a deleted `default` is re-created
/// (Kubernetes' `serviceAccountDeleted`; tombstones included).
struct ServiceAccountHandler(Weak<ServiceAccountController>);

impl EventHandler<ServiceAccount> for ServiceAccountHandler {
    fn on_add(&self, _obj: &Arc<ServiceAccount>, _is_initial_list: bool) {}
    fn on_update(&self, _old: &Arc<ServiceAccount>, _new: &Arc<ServiceAccount>) {}
    fn on_delete(&self, obj: &Deleted<ServiceAccount>) {
        if let (Some(c), Some(namespace)) =
            (self.0.upgrade(), obj.object().metadata.namespace.as_ref())
        {
            c.queue.add(namespace.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NamespaceStatus;

    fn namespace(phase: Option<&str>) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some("team-a".into()),
                ..ObjectMeta::default()
            },
            status: Some(NamespaceStatus {
                phase: phase.map(str::to_string),
                ..NamespaceStatus::default()
            }),
            ..Namespace::default()
        }
    }

    #[test]
    fn an_active_namespace_without_default_gets_it() {
        assert_eq!(
            missing_accounts(&namespace(Some("Active")), |_| false),
            ["default"]
        );
    }

    #[test]
    fn an_active_namespace_with_default_needs_nothing() {
        assert!(missing_accounts(&namespace(Some("Active")), |sa| sa == "default").is_empty());
    }

    #[test]
    fn a_namespace_that_is_not_active_gets_nothing() {
        assert!(missing_accounts(&namespace(Some("Terminating")), |_| false).is_empty());
        // No phase yet (not defaulted): not known to be active, so nothing either.
        assert!(missing_accounts(&namespace(None), |_| false).is_empty());
    }

    #[test]
    fn the_account_is_created_in_its_namespace() {
        let sa = service_account("team-a", "default");
        assert_eq!(sa.metadata.name.as_deref(), Some("default"));
        assert_eq!(sa.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(sa.automount_service_account_token, None);
    }
}
