//! `subPath` and `subPathExpr`: a part of a volume mounted alone, without letting the pod
//! reach outside the volume through a symlink it planted there (upstream's
//! `pkg/volume/util/subpath/subpath_linux.go`: `doBindSubPath`, `safeOpenSubPath`,
//! `doSafeOpen`, `doSafeMakeDir`; CVE-2017-1002101 is why it exists).
//!
//! The trick: resolve every symlink once, refuse the result if it is outside the volume,
//! then open the resolved path component by component with `openat(O_PATH|O_NOFOLLOW)` from
//! the volume's root (so a symlink swapped in after the check is refused, not followed), and
//! bind-mount the opened descriptor (`/proc/self/fd/N`) to a private target under the pod's
//! `volume-subpaths/<volume>/<container>/<index>`. The container gets that target: what was
//! checked is what is mounted, whatever the pod changes afterwards.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

use super::mount;

/// The folder of a pod's subPath bind mounts (upstream's `volume-subpaths`).
pub const VOLUME_SUBPATHS_DIR: &str = "volume-subpaths";

/// Flags of each step of the walk: a handle only, never following a symlink.
fn walk_flags() -> OFlags {
    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// What a container mount of a subPath needs.
#[derive(Clone, Debug)]
pub struct SubPath<'a> {
    /// The volume's directory on the node.
    pub volume_path: &'a Path,
    /// The subPath, relative to the volume (already expanded for `subPathExpr`).
    pub sub_path: &'a str,
    /// The pod's directory (`<root>/pods/<uid>`).
    pub pod_dir: &'a Path,
    /// The volume's name in the pod.
    pub volume_name: &'a str,
    /// The container's name.
    pub container_name: &'a str,
    /// The index of the mount in the container's `volumeMounts`.
    pub index: usize,
    /// The mount's name, for messages.
    pub mount_name: &'a str,
}

/// Checks the subPath's form as upstream's `makeMounts` does, before touching anything.
pub fn validate(sub_path: &str) -> Result<(), String> {
    if sub_path.starts_with('/') {
        return Err(format!(
            "error SubPath `{sub_path}` must not be an absolute path"
        ));
    }
    if sub_path.split('/').any(|p| p == "..") {
        return Err(format!(
            "unable to provision SubPath `{sub_path}`: must not contain '..'"
        ));
    }
    Ok(())
}

/// Makes the subPath if it is missing (as a directory, with the volume's mode), resolves it
/// safely and bind-mounts it; returns the path to give the container. Idempotent: a bind
/// mount already at the target is reused when it is the same file (device and inode) as the
/// subPath, and unmounted and made again otherwise (`prepareSubpathTarget`,
/// `checkSubPathFileEqual`).
pub fn prepare(sp: &SubPath<'_>) -> Result<PathBuf, String> {
    validate(sp.sub_path)?;
    let target = sp
        .pod_dir
        .join(VOLUME_SUBPATHS_DIR)
        .join(sp.volume_name)
        .join(sp.container_name)
        .join(sp.index.to_string());
    let host_path = sp.volume_path.join(sp.sub_path);
    if let Ok(Some(_)) = mount::mount_at(&target) {
        if same_file(&host_path, &target) {
            return Ok(target);
        }
        mount::unmount(&target).map_err(|e| format!("unmount {}: {e}", target.display()))?;
    }
    if fs::symlink_metadata(&host_path).is_err() {
        let mode = fs::metadata(sp.volume_path)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
            .map_err(|e| format!("stat {}: {e}", sp.volume_path.display()))?;
        safe_make_dir(sp.volume_path, sp.sub_path, mode).map_err(|e| {
            tracing::error!(error = %e, mount = sp.mount_name, container = sp.container_name, "creating a subPath directory");
            format!(
                "failed to create subPath directory for volumeMount \"{}\" of container \"{}\"",
                sp.mount_name, sp.container_name
            )
        })?;
    }
    bind_sub_path(sp, &host_path, &target).map_err(|e| {
        // The detail stays in the node's log: it could tell the pod about the host.
        tracing::error!(error = %e, mount = sp.mount_name, container = sp.container_name, "preparing a subPath");
        format!(
            "failed to prepare subPath for volumeMount \"{}\" of container \"{}\"",
            sp.mount_name, sp.container_name
        )
    })?;
    Ok(target)
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Resolves, checks, opens safely and bind-mounts (`doBindSubPath`).
pub fn bind_sub_path(sp: &SubPath<'_>, host_path: &Path, target: &Path) -> Result<(), String> {
    let volume = fs::canonicalize(sp.volume_path)
        .map_err(|e| format!("error resolving symlinks in {:?}: {e}", sp.volume_path))?;
    let resolved = fs::canonicalize(host_path)
        .map_err(|e| format!("error resolving symlinks in {host_path:?}: {e}"))?;
    if !resolved.starts_with(&volume) {
        return Err(format!(
            "subpath {resolved:?} not within volume path {volume:?}"
        ));
    }
    let fd = safe_open(&volume, &resolved)
        .map_err(|e| format!("error opening subpath {}: {e}", resolved.display()))?;
    let is_dir = FileType::from_raw_mode(
        rustix::fs::fstat(&fd)
            .map_err(|e| format!("fstat: {e}"))?
            .st_mode,
    ) == FileType::Directory;
    let parent = target
        .parent()
        .expect("the target is under the pod's directory");
    fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
    if is_dir {
        match fs::create_dir(target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("mkdir {}: {e}", target.display())),
        }
    } else {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(target)
            .map_err(|e| format!("create {}: {e}", target.display()))?;
    }
    let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    mount::bind(&source, target).map_err(|e| format!("bind-mount {}: {e}", target.display()))
}

/// Opens `path` (below `base`, both resolved) one component at a time without following a
/// symlink anywhere (`doSafeOpen`).
fn safe_open(base: &Path, path: &Path) -> Result<OwnedFd, String> {
    let rel = path.strip_prefix(base).map_err(|_| {
        format!(
            "path {} is outside of allowed base {}",
            path.display(),
            base.display()
        )
    })?;
    let mut fd = rustix::fs::open(
        base,
        OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::PATH,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open {}: {e}", base.display()))?;
    let mut current = base.to_path_buf();
    for component in rel.components() {
        let Component::Normal(name) = component else {
            return Err(format!("unexpected path element in {}", path.display()));
        };
        current.push(name);
        let child = rustix::fs::openat(fd.as_fd(), name, walk_flags(), Mode::empty())
            .map_err(|e| format!("cannot open {}: {e}", current.display()))?;
        let stat = rustix::fs::fstat(&child)
            .map_err(|e| format!("error running fstat on {}: {e}", current.display()))?;
        if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
            return Err(format!("unexpected symlink found {}", current.display()));
        }
        fd = child;
    }
    Ok(fd)
}

/// Creates the missing directories of `sub_path` below `base` without following symlinks
/// (`doSafeMakeDir`): existing components are opened `O_NOFOLLOW`, so a symlink among them
/// is refused; new ones are made with `mode` and chmod-ed to it.
fn safe_make_dir(base: &Path, sub_path: &str, mode: u32) -> Result<(), String> {
    let mut fd = rustix::fs::open(
        base,
        OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open directory {}: {e}", base.display()))?;
    let mut current = base.to_path_buf();
    for name in sub_path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        current.push(name);
        match rustix::fs::mkdirat(fd.as_fd(), name, Mode::from_raw_mode(mode)) {
            Ok(()) => {
                rustix::fs::chmodat(
                    fd.as_fd(),
                    name,
                    Mode::from_raw_mode(mode),
                    rustix::fs::AtFlags::empty(),
                )
                .map_err(|e| format!("chmod {}: {e}", current.display()))?;
            }
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(format!("mkdir {}: {e}", current.display())),
        }
        fd = rustix::fs::openat(
            fd.as_fd(),
            name,
            OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open directory {}: {e}", current.display()))?;
    }
    Ok(())
}
