//! The node status's view of the container runtime ([`RuntimeInfo`]) over the CRI client:
//! `Version` for `nodeInfo.containerRuntimeVersion`, `ListImages` for `status.images`.

use futures::future::BoxFuture;

use super::{Image, RuntimeInfo, RuntimeVersion};
use crate::cri::Cri;

impl RuntimeInfo for Cri {
    fn version(&self) -> BoxFuture<'_, anyhow::Result<RuntimeVersion>> {
        Box::pin(async move {
            let v = Cri::version(self).await?;
            Ok(RuntimeVersion {
                runtime_name: v.runtime_name,
                runtime_version: v.runtime_version,
            })
        })
    }

    fn list_images(&self) -> BoxFuture<'_, anyhow::Result<Vec<Image>>> {
        Box::pin(async move {
            let images = Cri::list_images(self, None).await?;
            Ok(images
                .into_iter()
                .map(|i| Image {
                    id: i.id,
                    repo_tags: i.repo_tags,
                    repo_digests: i.repo_digests,
                    size: i.size,
                })
                .collect())
        })
    }
}
