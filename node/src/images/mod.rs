//! Images without the internet: import of image tarballs into containerd ([`import`], checked
//! first by [`archive`]), a builder of small deterministic images from host files ([`build`]:
//! the pause image, the tests' busybox), and the images folder under the data dir whose
//! tarballs are imported at start and whenever one appears ([`watch`]), and what image
//! garbage collection knows of each image, its minimum age included ([`gc`]).

pub mod archive;
pub mod build;
pub mod gc;
pub mod import;
pub mod reference;
pub mod watch;

pub use build::{ImageBuilder, PAUSE_IMAGE};
pub use import::{ImportError, ImportReport, import_file};

use std::path::Path;

use crate::containerd::api::{ContainerdApi, K8S_NAMESPACE};

/// A client of containerd's API at `socket` in the `k8s.io` namespace, where imports go.
pub fn k8s_api(socket: &Path) -> ContainerdApi {
    ContainerdApi::new(socket, K8S_NAMESPACE).expect("k8s.io is a valid header value")
}

/// Builds the pause image from catatonit and imports it: what a node does at start, before
/// the CRI plugin may need it for a sandbox.
pub async fn import_pause_image(
    api: &ContainerdApi,
    catatonit: &Path,
    spool_dir: &Path,
) -> Result<ImportReport, anyhow::Error> {
    let image = build::pause_image(catatonit)?;
    let path = spool_dir.join(".skerry-pause.tar");
    let bytes = image.to_oci_archive()?;
    tokio::fs::write(&path, bytes).await?;
    let report = import_file(api, &path).await;
    let _ = tokio::fs::remove_file(&path).await;
    Ok(report?)
}
