//! The kubelet's checkpoints: state that must survive a restart of the kubelet (or of the
//! box), kept in small files, each checksummed (`docs/tricks.md` #22; upstream
//! `pkg/kubelet/checkpointmanager`, `pkg/kubelet/util/store/filestore.go`).
//!
//! - [`CheckpointManager`]: create / get / remove / list by key under one directory. A write
//!   goes to a temporary file (a `.` name, which listing skips), is synced, renamed over the
//!   key and the directory synced, so a crash leaves the old checkpoint or the new one, never
//!   half of one; a leftover temporary file is ignored.
//! - [`Checkpoint`]: marshal, unmarshal and verify, as upstream's interface. The checksum is
//!   FNV-32a over a dump of the struct ([`dump`]), not over the JSON bytes.
//! - The checkpoints: the CPU manager's ([`cpu_manager`], V1 and V2 and the migration), the
//!   memory manager's ([`memory_manager`]), the device manager's ([`device_manager`]), each
//!   with upstream's file name, JSON and checksum, so files move between skerry and an
//!   upstream kubelet; and the pods bound to the node ([`pods`]), which lets a box restart
//!   its pods while the API is out of reach.
//!
//! The trick it carries: the rename. A checkpoint type that got a new Go name (the CPU
//! manager's `CPUManagerCheckpointV2`, the memory manager's `MemoryManagerCheckpointV1`) would
//! hash differently from the same data under the old name, and an older kubelet after a
//! rollback would call the file corrupt. So the dump is hashed with the newer name replaced by
//! the older one, once: both kubelets compute the same checksum.

pub mod cpu_manager;
pub mod device_manager;
pub mod dump;
pub mod gojson;
pub mod memory_manager;
pub mod pods;

use std::io::Write;
use std::path::{Path, PathBuf};

/// Name prefix of the temporary files (upstream `filestore.go` `tmpPrefix`): listing skips
/// them, so a write torn by a crash leaves a file nothing reads.
pub const TMP_PREFIX: &str = ".";

/// The longest key (upstream `pkg/kubelet/util/store` `keyMaxLength`).
pub const KEY_MAX_LENGTH: usize = 250;

/// What a checkpoint operation can fail with (upstream `checkpointmanager/errors`).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// No file under the key (`ErrCheckpointNotFound`).
    #[error("checkpoint is not found")]
    NotFound,
    /// The checksum does not match the content (`CorruptCheckpointError`).
    #[error("checkpoint is corrupted")]
    Corrupt {
        /// The checksum of what the file holds.
        actual: u64,
        /// The checksum the file claims.
        expected: u64,
    },
    /// The file is not the checkpoint's JSON (Go's `encoding/json` message).
    #[error("{0}")]
    Json(String),
    /// A key that is not a file name the store accepts.
    #[error("invalid key: {0:?}")]
    InvalidKey(String),
    /// The file system.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A checkpoint (upstream `checkpointmanager.Checkpoint`).
pub trait Checkpoint {
    /// Sets the checksum and returns the file's bytes.
    fn marshal(&mut self) -> Result<Vec<u8>, CheckpointError>;
    /// Reads the file's bytes as Go's `json.Unmarshal` would.
    fn unmarshal(&mut self, blob: &[u8]) -> Result<(), CheckpointError>;
    /// Checks the checksum against the content.
    fn verify_checksum(&self) -> Result<(), CheckpointError>;
}

/// Checkpoints in one directory, by key (upstream `checkpointmanager.impl` over `FileStore`).
#[derive(Clone, Debug)]
pub struct CheckpointManager {
    dir: PathBuf,
}

impl CheckpointManager {
    /// A manager over `dir`, created if missing (mode 0755, as upstream).
    pub fn new(dir: impl Into<PathBuf>) -> Result<CheckpointManager, CheckpointError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(CheckpointManager { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of `key`.
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// Marshals `checkpoint` and writes it under `key` atomically.
    pub fn create(
        &self,
        key: &str,
        checkpoint: &mut dyn Checkpoint,
    ) -> Result<(), CheckpointError> {
        validate_key(key)?;
        let blob = checkpoint.marshal()?;
        std::fs::create_dir_all(&self.dir)?;
        write_atomically(&self.dir, key, &blob)
    }

    /// Reads `key` into `checkpoint` and verifies it.
    pub fn get(&self, key: &str, checkpoint: &mut dyn Checkpoint) -> Result<(), CheckpointError> {
        validate_key(key)?;
        let blob = match std::fs::read(self.path(key)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CheckpointError::NotFound);
            }
            Err(e) => return Err(e.into()),
        };
        checkpoint.unmarshal(&blob)?;
        checkpoint.verify_checksum()
    }

    /// Removes `key`; no error when it does not exist (as upstream).
    pub fn remove(&self, key: &str) -> Result<(), CheckpointError> {
        validate_key(key)?;
        match std::fs::remove_file(self.path(key)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// The keys present, temporary files left out, sorted.
    pub fn list(&self) -> Result<Vec<String>, CheckpointError> {
        let mut keys = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if !name.starts_with(TMP_PREFIX) {
                keys.push(name);
            }
        }
        keys.sort();
        Ok(keys)
    }
}

/// Upstream `store.ValidateKey`: `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most
/// [`KEY_MAX_LENGTH`] bytes (so a key is always one plain file name in the directory).
pub fn validate_key(key: &str) -> Result<(), CheckpointError> {
    let b = key.as_bytes();
    let edge = |c: u8| c.is_ascii_alphanumeric();
    let inner = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    let ok = !b.is_empty()
        && b.len() <= KEY_MAX_LENGTH
        && edge(b[0])
        && edge(b[b.len() - 1])
        && b.iter().all(|c| inner(*c));
    if ok {
        Ok(())
    } else {
        Err(CheckpointError::InvalidKey(key.to_string()))
    }
}

/// Upstream `filestore.go` `writeFile`: a temporary file in the same directory, written,
/// synced, closed, renamed over the key; then the directory synced so the rename itself
/// survives a power cut (upstream stops at the rename).
fn write_atomically(dir: &Path, key: &str, data: &[u8]) -> Result<(), CheckpointError> {
    let mut tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempfile_in(dir)?;
    tmp.write_all(data)?;
    tmp.as_file().sync_all()?;
    tmp.persist(dir.join(key)).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Raw(Vec<u8>);
    impl Checkpoint for Raw {
        fn marshal(&mut self) -> Result<Vec<u8>, CheckpointError> {
            Ok(self.0.clone())
        }
        fn unmarshal(&mut self, blob: &[u8]) -> Result<(), CheckpointError> {
            self.0 = blob.to_vec();
            Ok(())
        }
        fn verify_checksum(&self) -> Result<(), CheckpointError> {
            Ok(())
        }
    }

    #[test]
    fn create_get_list_remove_and_a_leftover_temporary_file_is_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = CheckpointManager::new(dir.path().join("state")).expect("manager");
        m.create("cpu_manager_state", &mut Raw(b"one".to_vec()))
            .expect("create");
        m.create("cpu_manager_state", &mut Raw(b"two".to_vec()))
            .expect("replace");
        // What a crash between write and rename leaves behind.
        std::fs::write(m.dir().join(".123456"), b"half of a checkpo").expect("leftover");
        assert_eq!(m.list().expect("list"), vec!["cpu_manager_state"]);
        let mut got = Raw(Vec::new());
        m.get("cpu_manager_state", &mut got).expect("get");
        assert_eq!(got.0, b"two");
        // No temporary file of its own is left by a write.
        let leftovers: Vec<_> = std::fs::read_dir(m.dir())
            .expect("read_dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.') && n != ".123456")
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        m.remove("cpu_manager_state").expect("remove");
        m.remove("cpu_manager_state")
            .expect("removing twice is fine");
        assert!(matches!(
            m.get("cpu_manager_state", &mut got),
            Err(CheckpointError::NotFound)
        ));
        assert!(matches!(
            m.create("../escape", &mut Raw(Vec::new())),
            Err(CheckpointError::InvalidKey(_))
        ));
        assert!(validate_key("Pod_8d3e-11.yaml").is_ok());
        assert!(validate_key(".hidden").is_err());
    }
}
