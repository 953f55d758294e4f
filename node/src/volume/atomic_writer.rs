//! Projecting a set of files into a volume directory so that a reader sees either the old set
//! or the new one, never a mix and never a missing file: the upstream kubelet's
//! `pkg/volume/util/atomic_writer.go` (`AtomicWriter.Write`), which every configMap, secret,
//! downwardAPI and projected volume goes through.
//!
//! The trick: the files live in a hidden directory named after the time of the write
//! (`..2024_06_01_12_00_00.123456789`); `..data` is a symlink to the current one, and each
//! user-visible top-level name is a symlink through it (`key -> ..data/key`, `dir ->
//! ..data/dir`). An update writes a whole new hidden directory, points a new symlink
//! `..data_tmp` at it and renames that over `..data` -- one `rename(2)`, atomic -- then adds
//! the new top-level links, drops the links to names no longer in the payload and removes the
//! old directory. A reader that resolves `key` resolves `..data` once, so it opens the old
//! file or the new one, whole.
//!
//! Rules kept from upstream:
//! - paths are relative, have no `..` element, do not start with `..` (the writer's own
//!   names), at most 4096 bytes with elements of at most 255;
//! - nothing is written when every file's content is unchanged and nothing is to be removed
//!   (a mode change alone does not rewrite, as upstream), but missing top-level links are
//!   still created (kubernetes/kubernetes#121472);
//! - file modes are set with `chmod` after the write so the umask does not narrow them; the
//!   hidden directory is 0755.
//!
//! Two differences, both found by the reader test in `node/tests/volume_atomic_writer.rs`:
//! - upstream removes the old timestamped directory right after the swap. A reader whose
//!   `open(2)` resolved `..data` to it just before the swap then looks the file up in a
//!   directory being emptied and gets `ENOENT` (path resolution is per component, not
//!   atomic). Here the old directory is *retired*: it stays for [`RETIRE_GRACE`] and is
//!   removed by a later write (or [`AtomicWriter::prune`]); directories this writer does not
//!   know (left by an earlier process) are removed at once, as upstream would have;
//! - a `..data_tmp` left by a crash between the symlink and the rename is removed before the
//!   next write (upstream's `symlink` would fail on it forever).
//!
//! Not safe for concurrent writers on one directory (upstream's rule too): the volume
//! manager holds one lock per pod volume around [`AtomicWriter::write`].

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, ErrorKind};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The symlink to the current timestamped directory.
pub const DATA_DIR_NAME: &str = "..data";
/// The symlink renamed over [`DATA_DIR_NAME`].
pub const NEW_DATA_DIR_NAME: &str = "..data_tmp";

/// The longest path element (`maxFileNameLength`; Linux's `NAME_MAX`).
const MAX_FILE_NAME_LENGTH: usize = 255;
/// The longest path (`maxPathLength`; Linux's `PATH_MAX`).
const MAX_PATH_LENGTH: usize = 4096;
/// Mode of the timestamped directory: group and others must traverse it to read the files.
const TS_DIR_MODE: u32 = 0o755;
/// How long a superseded data directory stays before it is removed: the longest a reader
/// may stall inside one `open(2)` between resolving `..data` and looking its file up. Costs
/// one extra copy of the volume's data per update in that window (a ConfigMap is at most
/// 1 MiB); shorter risks the `ENOENT` upstream's readers can see under load.
pub const RETIRE_GRACE: Duration = Duration::from_secs(5);
/// How many random names are tried before giving up on a new timestamped directory (Go's
/// `os.MkdirTemp` tries 10,000).
const TS_DIR_ATTEMPTS: u32 = 10_000;

/// One file of a payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    /// The content.
    pub data: Vec<u8>,
    /// The permission bits (`defaultMode` or the item's `mode`).
    pub mode: u32,
}

/// A payload: relative path -> file.
pub type Payload = BTreeMap<String, FileProjection>;

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A path of the payload is not allowed (upstream's message).
    #[error("{0}")]
    InvalidPath(String),
    /// A file system call failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> WriteError + use<> {
    let path = path.to_path_buf();
    move |source| WriteError::Io { what, path, source }
}

/// Writes payloads into one target directory (see the module docs).
#[derive(Debug)]
pub struct AtomicWriter {
    target_dir: PathBuf,
    /// Superseded data directories (names in the target dir) and when they were superseded.
    retired: Vec<(std::ffi::OsString, Instant)>,
}

impl AtomicWriter {
    /// A writer for `target_dir`, which must exist.
    pub fn new(target_dir: impl Into<PathBuf>) -> Result<AtomicWriter, WriteError> {
        let target_dir = target_dir.into();
        fs::metadata(&target_dir).map_err(io_err("stat the target directory", &target_dir))?;
        Ok(AtomicWriter {
            target_dir,
            retired: Vec::new(),
        })
    }

    /// The target directory.
    pub fn target_dir(&self) -> &Path {
        &self.target_dir
    }

    /// Projects `payload` into the target directory. Returns whether a new version was
    /// written (`false`: the content on disk already was the payload).
    pub fn write(&mut self, payload: &Payload) -> Result<bool, WriteError> {
        let payload = validate_payload(payload)?;
        let data_dir = self.target_dir.join(DATA_DIR_NAME);
        let old_ts = match fs::read_link(&data_dir) {
            Ok(target) => Some(target),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("read the data directory link", &data_dir)(e)),
        };

        let mut to_remove = BTreeSet::new();
        let mut should_write = true;
        if let Some(old) = &old_ts {
            let old_path = self.target_dir.join(old);
            to_remove = paths_to_remove(&payload, &old_path)?;
            if !payload_differs(&payload, &old_path)? && to_remove.is_empty() {
                should_write = false;
            }
        }
        if !should_write {
            // Up to date; still make sure every top-level link is there, and keep the
            // current directory.
            self.create_user_visible_files(&payload)?;
            self.prune()?;
            return Ok(false);
        }

        let ts_dir = self.new_timestamp_dir()?;
        if let Err(e) = write_payload_to_dir(&payload, &ts_dir) {
            let _ = fs::remove_dir_all(&ts_dir);
            return Err(e);
        }
        let ts_name = ts_dir
            .file_name()
            .expect("a directory we named has a file name")
            .to_owned();
        let new_data_dir = self.target_dir.join(NEW_DATA_DIR_NAME);
        match fs::remove_file(&new_data_dir) {
            Ok(()) => {
                tracing::warn!(dir = %self.target_dir.display(), "removed a stale ..data_tmp")
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove a stale ..data_tmp", &new_data_dir)(e)),
        }
        if let Err(e) = symlink(&ts_name, &new_data_dir) {
            let _ = fs::remove_dir_all(&ts_dir);
            return Err(io_err("create the ..data_tmp link", &new_data_dir)(e));
        }
        if let Err(e) = fs::rename(&new_data_dir, &data_dir) {
            let _ = fs::remove_file(&new_data_dir);
            let _ = fs::remove_dir_all(&ts_dir);
            return Err(io_err("rename ..data_tmp over ..data", &data_dir)(e));
        }
        self.create_user_visible_files(&payload)?;
        self.remove_user_visible_paths(&to_remove)?;
        if let Some(old) = old_ts {
            self.retired.push((old.into_os_string(), Instant::now()));
        }
        self.prune()?;
        Ok(true)
    }

    /// Removes the data directories superseded more than [`RETIRE_GRACE`] ago, and any
    /// hidden data directory that is neither current nor retired by this writer.
    pub fn prune(&mut self) -> Result<(), WriteError> {
        let current = fs::read_link(self.target_dir.join(DATA_DIR_NAME)).ok();
        let now = Instant::now();
        let entries = fs::read_dir(&self.target_dir)
            .map_err(io_err("list the target directory", &self.target_dir))?;
        let mut last = Ok(());
        for entry in entries {
            let entry = entry.map_err(io_err("list the target directory", &self.target_dir))?;
            let name = entry.file_name();
            let text = name.to_string_lossy();
            if !text.starts_with("..") || text == DATA_DIR_NAME || text == NEW_DATA_DIR_NAME {
                continue;
            }
            if current.as_deref().is_some_and(|c| c.as_os_str() == name) {
                continue;
            }
            let fresh = self
                .retired
                .iter()
                .any(|(n, at)| *n == name && now.duration_since(*at) < RETIRE_GRACE);
            if fresh {
                continue;
            }
            let path = entry.path();
            if let Err(e) = fs::remove_dir_all(&path) {
                last = Err(io_err("remove an old data directory", &path)(e));
            }
        }
        self.retired
            .retain(|(_, at)| now.duration_since(*at) < RETIRE_GRACE);
        last
    }

    /// A new hidden directory named after the UTC time (`..2006_01_02_15_04_05.` and a random
    /// number, as Go's `os.MkdirTemp` with upstream's pattern), mode 0755.
    fn new_timestamp_dir(&self) -> Result<PathBuf, WriteError> {
        let now = jiff::Timestamp::now();
        let prefix = now.strftime("..%Y_%m_%d_%H_%M_%S.").to_string();
        for _ in 0..TS_DIR_ATTEMPTS {
            let path = self
                .target_dir
                .join(format!("{prefix}{}", rand::random::<u32>()));
            match fs::create_dir(&path) {
                Ok(()) => {
                    fs::set_permissions(&path, fs::Permissions::from_mode(TS_DIR_MODE))
                        .map_err(io_err("chmod the new data directory", &path))?;
                    return Ok(path);
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create the new data directory", &path)(e)),
            }
        }
        Err(WriteError::Io {
            what: "find a free name for the new data directory in",
            path: self.target_dir.clone(),
            source: io::Error::from(ErrorKind::AlreadyExists),
        })
    }

    /// A `name -> ..data/name` link for every top-level name of the payload that has none.
    fn create_user_visible_files(&self, payload: &Payload) -> Result<(), WriteError> {
        for path in payload.keys() {
            let top = path.split('/').next().unwrap_or(path);
            let visible = self.target_dir.join(top);
            match fs::read_link(&visible) {
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    symlink(Path::new(DATA_DIR_NAME).join(top), &visible)
                        .map_err(io_err("create the user-visible link", &visible))?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Removes the top-level links of names no longer in the payload (nested names go with
    /// the old directory). Every one is tried; the last error is returned.
    fn remove_user_visible_paths(&self, paths: &BTreeSet<String>) -> Result<(), WriteError> {
        let mut last = Ok(());
        for path in paths.iter().filter(|p| !p.contains('/')) {
            let visible = self.target_dir.join(path);
            if let Err(e) = fs::remove_file(&visible) {
                tracing::error!(path = %visible.display(), error = %e, "pruning an old user-visible path");
                last = Err(io_err("remove the user-visible path", &visible)(e));
            }
        }
        last
    }
}

/// Checks every path and returns the payload keyed by cleaned paths (`validatePayload`).
pub fn validate_payload(payload: &Payload) -> Result<Payload, WriteError> {
    let mut clean = Payload::new();
    for (path, file) in payload {
        validate_path(path).map_err(WriteError::InvalidPath)?;
        clean.insert(clean_path(path), file.clone());
    }
    Ok(clean)
}

/// One path's rules, with upstream's messages (`validatePath`).
pub fn validate_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("invalid path: must not be empty: \"\"".to_string());
    }
    if path.starts_with('/') {
        return Err(format!("invalid path: must be relative path: {path}"));
    }
    if path.len() > MAX_PATH_LENGTH {
        return Err(format!(
            "invalid path: must be less than or equal to {MAX_PATH_LENGTH} characters"
        ));
    }
    let items: Vec<&str> = path.split('/').collect();
    for item in &items {
        if *item == ".." {
            return Err(format!("invalid path: must not contain '..': {path}"));
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return Err(format!(
                "invalid path: filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
            ));
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return Err(format!("invalid path: must not start with '..': {path}"));
    }
    Ok(())
}

/// Go's `filepath.Clean` for a relative path with no `..` element: empty and `.` elements
/// dropped.
fn clean_path(path: &str) -> String {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

/// Whether any file's content differs from the old directory's (or is missing there).
fn payload_differs(payload: &Payload, old: &Path) -> Result<bool, WriteError> {
    for (path, file) in payload {
        let on_disk = old.join(path);
        match fs::symlink_metadata(&on_disk) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
            _ => {}
        }
        let content = fs::read(&on_disk).map_err(io_err("read the current file", &on_disk))?;
        if content != file.data {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Every path of the old directory (files and directories, relative) that is neither in the
/// payload nor a parent directory of something in it.
fn paths_to_remove(payload: &Payload, old: &Path) -> Result<BTreeSet<String>, WriteError> {
    let mut current = BTreeSet::new();
    match walk(old, old, &mut current) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(e) => return Err(io_err("walk the current data directory", old)(e)),
        Ok(()) => {}
    }
    let mut new = BTreeSet::new();
    for path in payload.keys() {
        let mut sub = path.as_str();
        loop {
            new.insert(sub.to_string());
            match sub.rfind('/') {
                Some(at) => sub = &sub[..at],
                None => break,
            }
        }
    }
    Ok(current.difference(&new).cloned().collect())
}

fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if let Ok(rel) = path.strip_prefix(base) {
            out.insert(rel.to_string_lossy().into_owned());
        }
        if entry.file_type()?.is_dir() {
            walk(base, &path, out)?;
        }
    }
    Ok(())
}

/// Writes every file under `dir`, creating parents, and sets each file's mode exactly.
fn write_payload_to_dir(payload: &Payload, dir: &Path) -> Result<(), WriteError> {
    for (path, file) in payload {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            fs::create_dir_all(parent).map_err(io_err("create the directory", parent))?;
        }
        fs::write(&full, &file.data).map_err(io_err("write the file", &full))?;
        fs::set_permissions(&full, fs::Permissions::from_mode(file.mode))
            .map_err(io_err("chmod the file", &full))?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn paths_as_upstream_validates_them() {
        for ok in ["a", "a/b/c", "a..b", "..", "x/..y", ".a", "a/./b", "a//b"] {
            // `..` alone as the first element is allowed by the prefix rule but not by the
            // element rule.
            if ok == ".." {
                assert!(validate_path(ok).is_err());
                continue;
            }
            assert!(validate_path(ok).is_ok(), "{ok}");
        }
        let cases = [
            ("", "invalid path: must not be empty: \"\""),
            (
                "/etc/passwd",
                "invalid path: must be relative path: /etc/passwd",
            ),
            ("a/../b", "invalid path: must not contain '..': a/../b"),
            (
                "..data/x",
                "invalid path: must not start with '..': ..data/x",
            ),
            ("..x", "invalid path: must not start with '..': ..x"),
        ];
        for (path, want) in cases {
            assert_eq!(validate_path(path).unwrap_err(), want);
        }
        assert_eq!(
            validate_path(&"a".repeat(256)).unwrap_err(),
            "invalid path: filenames must be less than or equal to 255 characters"
        );
        assert_eq!(
            validate_path(&"a/".repeat(2049)).unwrap_err(),
            "invalid path: must be less than or equal to 4096 characters"
        );
        assert_eq!(clean_path("a/./b//c/"), "a/b/c");
    }
}
