//! `hostPath` volumes: a path of the node given to the container, checked against its `type`
//! first (upstream's `pkg/volume/hostpath/host_path.go` `SetUp`, `checkTypeInternal`,
//! `fileTypeChecker`).
//!
//! `DirectoryOrCreate` makes the directory (and its parents, mode 0755 less the umask) when
//! nothing is there, then checks it like `Directory`; `FileOrCreate` makes an empty file
//! (0644, parents not created, as upstream) and checks it like `File`; the device and socket
//! types only check; `""` checks nothing. Checks follow symlinks, as `os.Stat` does.

use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Mode of a directory `DirectoryOrCreate` makes.
const CREATED_DIR_MODE: u32 = 0o755;
/// Mode of a file `FileOrCreate` makes.
const CREATED_FILE_MODE: u32 = 0o644;

/// Checks (and for the `...OrCreate` types makes) `path` for a `hostPath` of type
/// `path_type`, with upstream's messages.
pub fn set_up(path: &str, path_type: Option<&str>) -> Result<(), String> {
    if path.split('/').any(|p| p == "..") {
        return Err(format!("invalid HostPath `{path}`: must not contain '..'"));
    }
    let path_type = path_type.unwrap_or("");
    if path_type.is_empty() {
        return Ok(());
    }
    check_type(Path::new(path), path_type)
}

fn check_type(path: &Path, path_type: &str) -> Result<(), String> {
    let shown = path.display();
    let meta = fs::metadata(path).ok();
    let is = |f: fn(&fs::FileType) -> bool| meta.as_ref().is_some_and(|m| f(&m.file_type()));
    match path_type {
        "DirectoryOrCreate" | "Directory" => {
            if path_type == "DirectoryOrCreate" && !exists(path) {
                return fs::DirBuilder::new()
                    .recursive(true)
                    .mode(CREATED_DIR_MODE)
                    .create(path)
                    .map_err(|e| format!("mkdir {shown}: {e}"));
            }
            if !is(fs::FileType::is_dir) {
                return Err(format!(
                    "hostPath type check failed: {shown} is not a directory"
                ));
            }
        }
        "FileOrCreate" | "File" => {
            if path_type == "FileOrCreate" && !exists(path) {
                return match OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(CREATED_FILE_MODE)
                    .open(path)
                {
                    Ok(_) => Ok(()),
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
                    Err(e) => Err(format!("open {shown}: {e}")),
                };
            }
            if !is(fs::FileType::is_file) {
                return Err(format!("hostPath type check failed: {shown} is not a file"));
            }
        }
        "Socket" => {
            if !is(FileTypeExt::is_socket) {
                return Err(format!(
                    "hostPath type check failed: {shown} is not a socket file"
                ));
            }
        }
        "CharDevice" => {
            if !is(FileTypeExt::is_char_device) {
                return Err(format!(
                    "hostPath type check failed: {shown} is not a character device"
                ));
            }
        }
        "BlockDevice" => {
            if !is(FileTypeExt::is_block_device) {
                return Err(format!(
                    "hostPath type check failed: {shown} is not a block device"
                ));
            }
        }
        other => return Err(format!("{other} is an invalid volume type")),
    }
    Ok(())
}

/// Whether anything is at `path`, following symlinks as upstream's `PathExists` (`os.Stat`)
/// does: a dangling link is "not there".
fn exists(path: &Path) -> bool {
    fs::metadata(path).is_ok()
}
