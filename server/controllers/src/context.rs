//! What every controller is started with: a client and a shared informer factory, so the
//! ReplicaSet, Deployment, garbage-collector and endpoints controllers share one pod informer
//! (one watch, one cache) instead of one each — client-go's `SharedInformerFactory`.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use skerry_client::informer::SharedInformer;
use skerry_client::{Client, Object};
use tokio_util::sync::CancellationToken;

/// kube-controller-manager's `--min-resync-period` is 12 h with each informer picking a random
/// period in [12 h, 24 h); skerry's controllers re-check everything every 10 minutes instead:
/// a three-box cluster has few objects, and a missed edge heals sooner.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(600);

/// Starts one informer until its token is cancelled.
type Starter = Box<dyn Fn(CancellationToken) + Send + Sync>;

/// Creates at most one informer per object type, across all controllers.
#[derive(Clone)]
pub struct InformerFactory {
    client: Client,
    resync: Option<Duration>,
    informers: Arc<Mutex<HashMap<TypeId, Box<dyn Any + Send + Sync>>>>,
    started: Arc<Mutex<Vec<Starter>>>,
}

impl InformerFactory {
    /// A factory over `client`, resyncing every `resync`.
    pub fn new(client: Client, resync: Option<Duration>) -> InformerFactory {
        InformerFactory {
            client,
            resync,
            informers: Arc::default(),
            started: Arc::default(),
        }
    }

    /// The shared informer for `K` across all namespaces (created on first use; started by
    /// [`InformerFactory::start`]).
    pub fn informer<K: Object + k8s_openapi::Resource>(&self) -> SharedInformer<K> {
        let mut map = self.informers.lock();
        if let Some(i) = map
            .get(&TypeId::of::<K>())
            .and_then(|b| b.downcast_ref::<SharedInformer<K>>())
        {
            return i.clone();
        }
        let informer = SharedInformer::new(self.client.api::<K>(None), self.resync);
        map.insert(TypeId::of::<K>(), Box::new(informer.clone()));
        let run = informer.clone();
        self.started
            .lock()
            .push(Box::new(move |stop: CancellationToken| run.run(stop)));
        informer
    }

    /// Starts every informer created so far (each exactly once) until `stop`.
    pub fn start(&self, stop: &CancellationToken) {
        for run in self.started.lock().drain(..) {
            run(stop.clone());
        }
    }
}

/// A controller's view of the cluster.
#[derive(Clone)]
pub struct Context {
    /// The client, rate-limited as the controller manager's (client-go QPS/burst).
    pub client: Client,
    /// The shared informers.
    pub informers: InformerFactory,
}

impl Context {
    /// A context over `client`.
    pub fn new(client: Client) -> Context {
        Context {
            informers: InformerFactory::new(client.clone(), Some(DEFAULT_RESYNC)),
            client,
        }
    }
}
