//! Container log rotation (upstream `pkg/kubelet/logs/container_log_manager.go`,
//! `--container-log-max-size` 10Mi and `--container-log-max-files` 5).
//!
//! Every [`MONITOR_PERIOD`] each running container's log file is measured; one at or past
//! the size is renamed to `<log>.<YYYYMMDD-hhmmss>` and the runtime is told to reopen it (CRI
//! `ReopenContainerLog`, so containerd writes a fresh file under the old name; a failed reopen
//! renames it back). Before that, the rotated files are tidied: leftovers of an interrupted
//! compression go, the oldest go until at most `max_files - 2` remain (with the current file and
//! the one about to be rotated that makes `max_files`), and all but the newest are gzipped
//! (`<name>.gz`, written to `.gz.tmp` then renamed, so a reader never sees half a file).
//! The newest rotated file stays plain: a `kubectl logs -f` reading it across the rename
//! finishes it before moving to the new file.
//!
//! A removed container's rotated files go with it ([`remove_rotated`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::cri::{Cri, api};

/// How often the logs are measured (upstream's `containerLogMonitorInterval`, 10 s): a
/// container writing faster than max-size per period overshoots by what it writes meanwhile.
pub const MONITOR_PERIOD: Duration = Duration::from_secs(10);

/// `--container-log-max-size`'s default, 10Mi (`KubeletConfiguration` `containerLogMaxSize`).
pub const DEFAULT_MAX_SIZE: u64 = 10 * 1024 * 1024;

/// `--container-log-max-files`' default (`containerLogMaxFiles`).
pub const DEFAULT_MAX_FILES: usize = 5;

/// The suffix of a rotated file's timestamp (Go's layout `20060102-150405`).
const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";
const COMPRESS_SUFFIX: &str = ".gz";
const TMP_SUFFIX: &str = ".tmp";

/// The rotation policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPolicy {
    /// Rotate a log once it is this big.
    pub max_size: u64,
    /// Keep at most this many files per container, the current one included (at least 2).
    pub max_files: usize,
}

impl Default for LogPolicy {
    fn default() -> Self {
        LogPolicy {
            max_size: DEFAULT_MAX_SIZE,
            max_files: DEFAULT_MAX_FILES,
        }
    }
}

impl LogPolicy {
    /// The flags checked as the kubelet's `NewContainerLogManager` does.
    pub fn new(max_size: &str, max_files: usize) -> Result<LogPolicy, String> {
        let quantity = skerry_api::validation::quantity::Quantity::parse(max_size)
            .ok_or_else(|| format!("--container-log-max-size: invalid quantity {max_size:?}"))?;
        let bytes = quantity.0 / 1_000_000_000;
        if quantity.0 <= 0 || bytes <= 0 {
            return Err(format!(
                "--container-log-max-size: {max_size:?} must be at least one byte"
            ));
        }
        if max_files <= 1 {
            return Err(format!(
                "--container-log-max-files: invalid MaxFiles {max_files}, must be > 1"
            ));
        }
        Ok(LogPolicy {
            max_size: u64::try_from(bytes).unwrap_or(u64::MAX),
            max_files,
        })
    }
}

/// The rotated files of `log` (`<log>.*`), sorted oldest first (the timestamps sort).
fn rotated_files(log: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Drops leftovers (`.tmp` files, a plain file whose `.gz` exists), then the oldest files
/// beyond `max_files - 2`, and gzips all but the newest. Returns what is left.
pub fn tidy(log: &Path, max_files: usize) -> std::io::Result<Vec<PathBuf>> {
    let mut logs = Vec::new();
    let all = rotated_files(log);
    for path in &all {
        let name = path.to_string_lossy();
        let compressed_twin = PathBuf::from(format!("{name}{COMPRESS_SUFFIX}"));
        if name.ends_with(TMP_SUFFIX) || all.contains(&compressed_twin) {
            remove_quiet(path)?;
        } else {
            logs.push(path.clone());
        }
    }
    let keep = max_files.saturating_sub(2);
    let excess = logs.len().saturating_sub(keep);
    for path in logs.drain(..excess) {
        remove_quiet(&path)?;
    }
    let newest = logs.len().saturating_sub(1);
    for path in logs.iter_mut().take(newest) {
        if !path.to_string_lossy().ends_with(COMPRESS_SUFFIX) {
            *path = compress(path)?;
        }
    }
    Ok(logs)
}

fn remove_quiet(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `path` gzipped into `path.gz` (through `path.gz.tmp`), the original removed.
fn compress(path: &Path) -> std::io::Result<PathBuf> {
    let target = PathBuf::from(format!("{}{COMPRESS_SUFFIX}", path.display()));
    let tmp = PathBuf::from(format!("{}{TMP_SUFFIX}", target.display()));
    {
        let mut input = std::fs::File::open(path)?;
        let mut out = GzEncoder::new(std::fs::File::create(&tmp)?, Compression::default());
        std::io::copy(&mut input, &mut out)?;
        out.finish()?.flush()?;
    }
    std::fs::rename(&tmp, &target)?;
    std::fs::remove_file(path)?;
    Ok(target)
}

/// The name `log` is rotated to at `now`.
pub fn rotated_name(log: &Path, now: jiff::Timestamp) -> PathBuf {
    let stamp = now
        .to_zoned(jiff::tz::TimeZone::UTC)
        .strftime(TIMESTAMP_FORMAT);
    PathBuf::from(format!("{}.{stamp}", log.display()))
}

/// Removes a container's rotated files (upstream's `Clean`, when the container is removed).
pub fn remove_rotated(log: &Path) {
    for path in rotated_files(log) {
        if let Err(e) = remove_quiet(&path) {
            debug!(path = %path.display(), error = %e, "removing a rotated log failed");
        }
    }
}

/// Rotates `id`'s log `log` if it reached the size.
async fn rotate_one(cri: &Cri, policy: LogPolicy, id: &str, log: &Path) -> std::io::Result<()> {
    let Ok(meta) = tokio::fs::metadata(log).await else {
        return Ok(());
    };
    if meta.len() < policy.max_size {
        return Ok(());
    }
    let path = log.to_path_buf();
    let max_files = policy.max_files;
    tokio::task::spawn_blocking(move || tidy(&path, max_files))
        .await
        .map_err(std::io::Error::other)??;
    let rotated = rotated_name(log, jiff::Timestamp::now());
    if tokio::fs::try_exists(&rotated).await.unwrap_or(false) {
        // Rotated this very second already: wait for the next round rather than overwrite.
        return Ok(());
    }
    tokio::fs::rename(log, &rotated).await?;
    if let Err(e) = cri.reopen_container_log(id).await {
        // The file is still the runtime's: put it back so nothing is lost.
        let _ = tokio::fs::rename(&rotated, log).await;
        return Err(std::io::Error::other(e.to_string()));
    }
    debug!(container = %id, to = %rotated.display(), "container log rotated");
    Ok(())
}

/// One round over the running containers.
pub async fn rotate_logs(cri: &Cri, policy: LogPolicy) {
    let running = api::ContainerFilter {
        state: Some(api::ContainerStateValue {
            state: api::ContainerState::ContainerRunning as i32,
        }),
        ..Default::default()
    };
    let containers = match cri.list_containers(Some(running)).await {
        Ok(c) => c,
        Err(e) => {
            debug!(error = %e, "log rotation: listing containers failed");
            return;
        }
    };
    for c in containers {
        let status = match cri.container_status(&c.id, false).await {
            Ok(s) => s.status,
            Err(e) => {
                debug!(container = %c.id, error = %e, "log rotation: container status failed");
                continue;
            }
        };
        let Some(log_path) = status.map(|s| s.log_path).filter(|p| !p.is_empty()) else {
            continue;
        };
        if let Err(e) = rotate_one(cri, policy, &c.id, Path::new(&log_path)).await {
            warn!(container = %c.id, log = %log_path, error = %e, "rotating a container log failed");
        }
    }
}

/// Rotates every [`MONITOR_PERIOD`] until `stop`.
pub async fn run(cri: Cri, policy: LogPolicy, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(MONITOR_PERIOD) => {}
            () = stop.cancelled() => return,
        }
        rotate_logs(&cri, policy).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    #[test]
    fn names_carry_a_utc_timestamp() {
        let t: jiff::Timestamp = "2024-03-05T06:07:08Z".parse().expect("time");
        assert_eq!(
            rotated_name(Path::new("/l/c/0.log"), t),
            PathBuf::from("/l/c/0.log.20240305-060708")
        );
    }

    #[test]
    fn policy_flags_are_checked() {
        assert_eq!(
            LogPolicy::new("10Mi", 5),
            Ok(LogPolicy {
                max_size: 10 * 1024 * 1024,
                max_files: 5
            })
        );
        assert!(LogPolicy::new("10Mi", 1).is_err());
        assert!(LogPolicy::new("lots", 5).is_err());
        assert!(LogPolicy::new("0", 5).is_err());
    }

    #[test]
    fn tidy_prunes_and_compresses_all_but_the_newest() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("0.log");
        std::fs::write(&log, "current").expect("write");
        for (name, body) in [
            ("0.log.20240101-000001", "one"),
            ("0.log.20240101-000002", "two"),
            ("0.log.20240101-000003", "three"),
            ("0.log.20240101-000004", "four"),
            ("0.log.20240101-000003.gz.tmp", "half"),
        ] {
            std::fs::write(dir.path().join(name), body).expect("write");
        }
        std::fs::write(dir.path().join("1.log"), "other container").expect("write");
        let left = tidy(&log, 4).expect("tidy");
        let names: Vec<String> = left
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["0.log.20240101-000003.gz", "0.log.20240101-000004"]);
        let mut text = String::new();
        flate2::read::GzDecoder::new(
            std::fs::File::open(dir.path().join("0.log.20240101-000003.gz")).expect("open"),
        )
        .read_to_string(&mut text)
        .expect("gunzip");
        assert_eq!(text, "three");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        assert_eq!(
            on_disk,
            [
                "0.log",
                "0.log.20240101-000003.gz",
                "0.log.20240101-000004",
                "1.log"
            ]
        );
        remove_rotated(&log);
        assert!(log.exists());
        assert_eq!(rotated_files(&log), Vec::<PathBuf>::new());
    }
}
