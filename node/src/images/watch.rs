//! The images folder (`<data-dir>/agent/images`, as k3s's `agent/images`): every tarball in it
//! is imported at start and whenever one appears or changes.
//!
//! The folder is polled ([`POLL_INTERVAL`]). A file is imported once it has not been modified
//! for [`SETTLE`], so a file still being copied in is not read half-written; each
//! `(name, size, mtime)` is tried once, so a file is not imported twice, and a file that
//! failed (a copy paused for longer than the settle time, a corrupt archive) is tried again
//! only when it changes. Writing the file elsewhere and renaming it in avoids the question.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::{info, warn};

use super::import::{ImportReport, import_file};
use crate::containerd::api::ContainerdApi;

/// How often the folder is looked at. An image dropped in is ready within this plus
/// [`SETTLE`]; a stat of a handful of files per interval costs nothing.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// How long a file must be left unmodified before it is imported.
pub const SETTLE: Duration = Duration::from_secs(2);

/// The file names imported: tarballs, optionally gzip-compressed (k3s's list without the
/// zstd/bzip2/lz4 variants, which skerry does not read).
pub const SUFFIXES: &[&str] = &[".tar", ".tar.gz", ".tgz"];

type Seen = HashMap<PathBuf, (u64, SystemTime)>;

/// The outcome of one file's import, as the folder watcher reports it.
#[derive(Debug)]
pub struct FolderImport {
    pub path: PathBuf,
    pub result: Result<ImportReport, String>,
}

/// Imports what is ready in `dir` now, skipping what `seen` says was tried at that size and
/// mtime; returns what it tried.
async fn scan(api: &ContainerdApi, dir: &Path, seen: &mut Seen) -> Vec<FolderImport> {
    let mut done = Vec::new();
    let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
        return done;
    };
    let mut ready = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !SUFFIXES.iter().any(|s| name.ends_with(s)) {
            continue;
        }
        let Ok(meta) = entry.metadata().await else {
            continue;
        };
        let Ok(mtime) = meta.modified() else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let settled = SystemTime::now()
            .duration_since(mtime)
            .is_ok_and(|age| age >= SETTLE);
        let stamp = (meta.len(), mtime);
        if settled && seen.get(&entry.path()) != Some(&stamp) {
            ready.push((entry.path(), stamp));
        }
    }
    ready.sort();
    for (path, stamp) in ready {
        let result = import_file(api, &path).await.map_err(|e| e.to_string());
        match &result {
            Ok(report) => {
                info!(path = %path.display(), images = ?report.images, took = ?report.took, "imported images")
            }
            Err(err) => {
                warn!(path = %path.display(), %err, "image import failed; retried when the file changes")
            }
        }
        seen.insert(path.clone(), stamp);
        done.push(FolderImport { path, result });
    }
    done
}

/// Watches `dir` until `stop` turns true, importing its tarballs; each attempt is also sent
/// on `events` when given (the tests read it).
pub async fn watch_folder(
    api: ContainerdApi,
    dir: PathBuf,
    mut stop: watch::Receiver<bool>,
    events: Option<tokio::sync::mpsc::UnboundedSender<FolderImport>>,
) {
    let mut seen = Seen::new();
    loop {
        for event in scan(&api, &dir, &mut seen).await {
            if let Some(events) = &events {
                let _ = events.send(event);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
    }
}
