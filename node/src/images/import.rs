//! Writing a checked [`ImageArchive`] into containerd through its own gRPC API: blobs into
//! the content store, then one image record per name, in the `k8s.io` namespace where the CRI
//! plugin looks.
//!
//! The import runs under a lease, so blobs written before the image records exist are not
//! collected; the lease expires by itself ([`LEASE_EXPIRY`]) if skerry dies mid-import, and
//! then the unnamed blobs are collected: nothing half-imported is ever named. Manifests and
//! indexes carry containerd's `containerd.io/gc.ref.content.*` labels, which keep their config
//! and layers alive once the lease is gone. Creating the image record publishes containerd's
//! `/images/create` event; the CRI plugin (1.6, `pkg/cri/server/events.go`) adds the image to
//! its store on it, and unpacks the layers into a snapshot on the first `CreateContainer`
//! (`pkg/cri/opts/container.go`, `WithNewSnapshot`).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
use tokio_stream::wrappers::ReceiverStream;

use super::archive::{self, ArchiveError, Blob, BlobData, ImageArchive};
use crate::containerd::api::{ContainerdApi, proto};

/// The size of each `Write` message: well under containerd's 16 MiB receive limit, large
/// enough that per-message overhead is noise.
const WRITE_CHUNK: usize = 1024 * 1024;

/// How many `Write` messages may be in flight ahead of containerd's answers.
const WRITE_PIPELINE: usize = 4;

/// How long an import's lease outlives a skerry that died mid-import before containerd's
/// garbage collector may take its blobs (containerd's `containerd.io/gc.expire` label). An
/// import of a large image over a slow disk fits in it.
pub const LEASE_EXPIRY: Duration = Duration::from_secs(60 * 60);

/// The deadline of each small call (Info, Update, Create, lease calls).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline of writing one blob: a multi-GiB layer on a slow disk.
const BLOB_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What went wrong in an import.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("containerd {call}{}: {}: {}", if .subject.is_empty() { String::new() } else { format!(" ({})", .subject) }, .code.description(), .message)]
    Containerd {
        call: &'static str,
        subject: String,
        code: tonic::Code,
        message: String,
    },
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "blob {digest} changed while it was imported (now {actual}): the file is being rewritten"
    )]
    Changed { digest: String, actual: String },
    #[error("internal: {0}")]
    Internal(String),
}

fn grpc(call: &'static str, subject: impl Into<String>, status: &tonic::Status) -> ImportError {
    ImportError::Containerd {
        call,
        subject: subject.into(),
        code: status.code(),
        message: status.message().to_string(),
    }
}

/// What an import did.
#[derive(Clone, Debug, Default)]
pub struct ImportReport {
    /// The names created or updated, with the digest of their manifest or index.
    pub images: Vec<(String, String)>,
    /// Blobs written.
    pub blobs_written: usize,
    /// Blobs containerd already had.
    pub blobs_present: usize,
    /// Bytes written.
    pub bytes_written: u64,
    /// How long it took, checks included.
    pub took: Duration,
}

/// Checks the tarball at `path` and imports its images into containerd.
pub async fn import_file(api: &ContainerdApi, path: &Path) -> Result<ImportReport, ImportError> {
    let started = Instant::now();
    let owned = path.to_path_buf();
    let archive = tokio::task::spawn_blocking(move || archive::read(&owned))
        .await
        .map_err(|e| ImportError::Internal(format!("archive reader: {e}")))??;
    let mut report = import_archive(api, &archive).await?;
    report.took = started.elapsed();
    Ok(report)
}

/// Imports a checked archive.
pub async fn import_archive(
    api: &ContainerdApi,
    archive: &ImageArchive,
) -> Result<ImportReport, ImportError> {
    let lease = create_lease(api).await?;
    let result = import_under_lease(api, archive, &lease).await;
    // Named images now hold what they need; without names, the blobs go with the lease.
    let mut leases = api.leases.clone();
    let delete = proto::leases::DeleteRequest {
        id: lease.clone(),
        sync: false,
    };
    if let Err(status) = with_deadline(leases.delete(api.request(delete, None))).await {
        tracing::warn!(%lease, %status, "could not delete an import lease; it expires by itself");
    }
    result
}

async fn create_lease(api: &ContainerdApi) -> Result<String, ImportError> {
    let expires = SystemTime::now() + LEASE_EXPIRY;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let id = format!("skerry-import-{}-{nanos}", std::process::id());
    let mut labels = HashMap::new();
    labels.insert("containerd.io/gc.expire".to_string(), rfc3339(expires));
    let mut leases = api.leases.clone();
    let req = proto::leases::CreateRequest {
        id: id.clone(),
        labels,
    };
    with_deadline(leases.create(api.request(req, None)))
        .await
        .map_err(|s| grpc("Leases.Create", id.clone(), &s))?;
    Ok(id)
}

async fn import_under_lease(
    api: &ContainerdApi,
    archive: &ImageArchive,
    lease: &str,
) -> Result<ImportReport, ImportError> {
    let mut report = ImportReport::default();
    for blob in &archive.blobs {
        let mut content = api.content.clone();
        let info = proto::content::InfoRequest {
            digest: blob.digest.clone(),
        };
        match with_deadline(content.info(api.request(info, Some(lease)))).await {
            Ok(_) => report.blobs_present += 1,
            Err(status) if status.code() == tonic::Code::NotFound => {
                write_blob(api, lease, &archive.tar_path, blob).await?;
                report.blobs_written += 1;
                report.bytes_written += blob.size;
            }
            Err(status) => return Err(grpc("Content.Info", blob.digest.clone(), &status)),
        }
        if !blob.gc_labels.is_empty() {
            set_labels(api, lease, blob).await?;
        }
    }
    for (name, target) in &archive.images {
        let image = proto::images::Image {
            name: name.clone(),
            labels: HashMap::new(),
            target: Some(proto::types::Descriptor {
                media_type: target.media_type.clone(),
                digest: target.digest.clone(),
                size: i64::try_from(target.size)
                    .map_err(|_| ImportError::Internal("blob size overflows".into()))?,
                annotations: HashMap::new(),
            }),
            created_at: None,
            updated_at: None,
        };
        let mut images = api.images.clone();
        let create = proto::images::CreateImageRequest {
            image: Some(image.clone()),
        };
        match with_deadline(images.create(api.request(create, Some(lease)))).await {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::AlreadyExists => {
                let update = proto::images::UpdateImageRequest {
                    image: Some(image),
                    update_mask: Some(prost_types::FieldMask {
                        paths: vec!["target".to_string()],
                    }),
                };
                with_deadline(images.update(api.request(update, Some(lease))))
                    .await
                    .map_err(|s| grpc("Images.Update", name.clone(), &s))?;
            }
            Err(status) => return Err(grpc("Images.Create", name.clone(), &status)),
        }
        report.images.push((name.clone(), target.digest.clone()));
    }
    Ok(report)
}

/// Sets a manifest's or index's garbage-collection labels (also when containerd already had
/// the blob, perhaps without them).
async fn set_labels(api: &ContainerdApi, lease: &str, blob: &Blob) -> Result<(), ImportError> {
    let labels: HashMap<String, String> = blob.gc_labels.clone().into_iter().collect();
    let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
    let req = proto::content::UpdateRequest {
        info: Some(proto::content::Info {
            digest: blob.digest.clone(),
            labels,
            ..Default::default()
        }),
        update_mask: Some(prost_types::FieldMask { paths }),
    };
    let mut content = api.content.clone();
    with_deadline(content.update(api.request(req, Some(lease))))
        .await
        .map_err(|s| grpc("Content.Update", blob.digest.clone(), &s))?;
    Ok(())
}

/// Streams one blob into containerd and commits it under its digest. The bytes are hashed
/// again as they go: a file rewritten since it was checked is aborted, not committed.
async fn write_blob(
    api: &ContainerdApi,
    lease: &str,
    tar_path: &Path,
    blob: &Blob,
) -> Result<(), ImportError> {
    let write_ref = format!("{lease}-{}", blob.digest);
    let (tx, rx) = tokio::sync::mpsc::channel(WRITE_PIPELINE);
    let producer = {
        let write_ref = write_ref.clone();
        let blob = blob.clone();
        let tar_path = tar_path.to_path_buf();
        tokio::spawn(async move { produce(tx, write_ref, &tar_path, &blob).await })
    };
    let mut content = api.content.clone();
    let streamed = async {
        let mut responses = content
            .write(api.request(ReceiverStream::new(rx), Some(lease)))
            .await?
            .into_inner();
        let mut committed = None;
        while let Some(resp) = responses.message().await? {
            if resp.action == proto::content::WriteAction::Commit as i32 {
                committed = Some(resp.digest);
            }
        }
        Ok::<_, tonic::Status>(committed)
    };
    let outcome = tokio::time::timeout(BLOB_TIMEOUT, streamed).await;
    let produced = producer
        .await
        .map_err(|e| ImportError::Internal(format!("blob reader: {e}")))?;
    let result = match (outcome, produced) {
        (_, Err(err)) => Err(err),
        (Ok(Ok(Some(digest))), Ok(())) if digest == blob.digest => Ok(()),
        (Ok(Ok(other)), Ok(())) => Err(ImportError::Internal(format!(
            "containerd committed {other:?} for {}",
            blob.digest
        ))),
        // Written meanwhile by someone else: the content is there, which is all we need.
        (Ok(Err(status)), Ok(())) if status.code() == tonic::Code::AlreadyExists => return Ok(()),
        (Ok(Err(status)), Ok(())) => Err(grpc("Content.Write", blob.digest.clone(), &status)),
        (Err(_), Ok(())) => Err(ImportError::Containerd {
            call: "Content.Write",
            subject: blob.digest.clone(),
            code: tonic::Code::DeadlineExceeded,
            message: format!("not written within {BLOB_TIMEOUT:?}"),
        }),
    };
    if result.is_err() {
        let mut content = api.content.clone();
        let abort = proto::content::AbortRequest { r#ref: write_ref };
        let _ = with_deadline(content.abort(api.request(abort, Some(lease)))).await;
    }
    result
}

/// Sends a blob's bytes as `Write` messages and, if they hash to its digest, a `Commit`.
async fn produce(
    tx: tokio::sync::mpsc::Sender<proto::content::WriteContentRequest>,
    write_ref: String,
    tar_path: &Path,
    blob: &Blob,
) -> Result<(), ImportError> {
    let io = |source| ImportError::Io {
        path: tar_path.display().to_string(),
        source,
    };
    let total = i64::try_from(blob.size).map_err(|_| ImportError::Internal("size".into()))?;
    let mut hasher = Sha256::new();
    let mut offset: u64 = 0;
    let send = |req| {
        let tx = tx.clone();
        async move { tx.send(req).await.is_ok() }
    };
    match &blob.data {
        BlobData::Memory(bytes) => {
            hasher.update(bytes);
            for chunk in bytes.chunks(WRITE_CHUNK) {
                let req = write_request(&write_ref, offset, chunk.to_vec());
                if !send(req).await {
                    return Ok(());
                }
                offset += chunk.len() as u64;
            }
        }
        BlobData::Archive { offset: start } => {
            let mut file = tokio::fs::File::open(tar_path).await.map_err(io)?;
            file.seek(std::io::SeekFrom::Start(*start))
                .await
                .map_err(io)?;
            let mut file = file.take(blob.size);
            loop {
                let mut buf = vec![0u8; WRITE_CHUNK];
                let mut filled = 0;
                while filled < buf.len() {
                    let n = file.read(&mut buf[filled..]).await.map_err(io)?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                if filled == 0 {
                    break;
                }
                buf.truncate(filled);
                hasher.update(&buf);
                let req = write_request(&write_ref, offset, buf);
                offset += filled as u64;
                if !send(req).await {
                    // containerd ended the stream; its status says why.
                    return Ok(());
                }
            }
        }
    }
    let actual = archive::hex_digest(hasher);
    if actual != blob.digest || offset != blob.size {
        return Err(ImportError::Changed {
            digest: blob.digest.clone(),
            actual,
        });
    }
    let commit = proto::content::WriteContentRequest {
        action: proto::content::WriteAction::Commit as i32,
        r#ref: write_ref,
        total,
        expected: blob.digest.clone(),
        offset: offset as i64,
        ..Default::default()
    };
    let _ = send(commit).await;
    Ok(())
}

fn write_request(
    write_ref: &str,
    offset: u64,
    data: Vec<u8>,
) -> proto::content::WriteContentRequest {
    proto::content::WriteContentRequest {
        action: proto::content::WriteAction::Write as i32,
        r#ref: write_ref.to_string(),
        offset: offset as i64,
        data,
        ..Default::default()
    }
}

async fn with_deadline<T>(
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(result) => result.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within {CALL_TIMEOUT:?}"
        ))),
    }
}

/// `time` as RFC 3339 UTC (`2006-01-02T15:04:05Z`), what containerd's `gc.expire` label holds.
fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let days = i64::try_from(secs / 86_400).unwrap_or_default();
    let rem = secs % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_709_251_199)),
            "2024-02-29T23:59:59Z"
        );
    }
}
