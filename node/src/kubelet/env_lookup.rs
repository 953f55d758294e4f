//! The object lookup of a container's environment while the pods run from the pod checkpoint
//! (`crate::checkpoint::pods`): the API has not answered since the kubelet started, so no
//! Service can be listed. Upstream's kubelet refuses an environment until its service lister
//! has synced once (`pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables`,
//! `serviceHasSynced`), which would keep every checkpointed pod from starting; the kubelet of
//! the bootstrap-checkpoint days (`pkg/kubelet/checkpoint/checkpoint.go`) listed from an
//! empty cache instead. This does the latter: a failed Service list is no Service, so the
//! container starts without the service links (and without `KUBERNETES_SERVICE_HOST`) until
//! it is next created with the API back. ConfigMaps and Secrets still fail as before: a
//! value the pod names cannot be made up.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use tracing::warn;

use crate::env::{Lookup, LookupError};

/// [`Lookup`] over `L` whose Service lists answer empty when they fail.
pub struct Offline<'a, L>(pub &'a L);

impl<L: Lookup> Lookup for Offline<'_, L> {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ConfigMap>>, LookupError> {
        self.0.config_map(namespace, name).await
    }

    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, LookupError> {
        self.0.secret(namespace, name).await
    }

    async fn services(&self, namespace: &str) -> Result<Vec<Arc<Service>>, LookupError> {
        match self.0.services(namespace).await {
            Ok(s) => Ok(s),
            Err(e) => {
                warn!(%namespace, error = %e.0, "no Services without the API: a container of a checkpointed pod starts without service links");
                Ok(Vec::new())
            }
        }
    }
}
