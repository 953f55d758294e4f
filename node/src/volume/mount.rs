//! The mount calls volumes need, without `unsafe` (rustix): tmpfs for memory-backed
//! emptyDirs, secrets and projected volumes, bind mounts for subPaths, and reading
//! `/proc/self/mountinfo` to know what is mounted where (so set-up is idempotent and
//! tear-down finds what to unmount).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, UnmountFlags};

/// Where the kernel lists this process's mounts.
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of mountinfo: the mount point and its file system type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// `tmpfs`, `ext4`, ...
    pub fs_type: String,
    /// The super block options (`rw,size=1024k`).
    pub super_options: String,
}

/// Every mount of this process's mount namespace.
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&fs::read_to_string(MOUNTINFO)?))
}

/// Parses mountinfo (`proc(5)`): field 5 is the mount point (octal escapes for space, tab,
/// newline and backslash); after the ` - ` separator come the type, the source and the super
/// block options.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = before.split(' ').nth(4) else {
            continue;
        };
        let mut rest = after.split(' ');
        let fs_type = rest.next().unwrap_or_default().to_string();
        let _source = rest.next();
        let super_options = rest.next().unwrap_or_default().to_string();
        out.push(MountEntry {
            mount_point: PathBuf::from(unescape(mount_point)),
            fs_type,
            super_options,
        });
    }
    out
}

fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Some(v) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|t| u8::from_str_radix(t, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount at exactly `path` (the last one, if stacked), if any.
pub fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let path = fs::canonicalize(path)?;
    Ok(mounts()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// Mounts a tmpfs on `dir`, `size=<bytes>` when given (otherwise the kernel's default, half
/// of RAM), as upstream's `setupTmpfs` does.
pub fn mount_tmpfs(dir: &Path, size_bytes: Option<u64>) -> io::Result<()> {
    let data = size_bytes.map(|s| format!("size={s}")).unwrap_or_default();
    let data = std::ffi::CString::new(data).expect("a formatted number holds no NUL byte");
    rustix::mount::mount(
        "tmpfs",
        dir,
        "tmpfs",
        MountFlags::empty(),
        Some(data.as_c_str()),
    )
    .map_err(io::Error::from)
}

/// Bind-mounts `source` on `target`.
pub fn bind(source: &Path, target: &Path) -> io::Result<()> {
    rustix::mount::mount_bind(source, target).map_err(io::Error::from)
}

/// Unmounts `target`.
pub fn unmount(target: &Path) -> io::Result<()> {
    rustix::mount::unmount(target, UnmountFlags::empty()).map_err(io::Error::from)
}

/// Unmounts everything mounted at or below `dir`, deepest first.
pub fn unmount_all_under(dir: &Path) -> io::Result<()> {
    let Ok(dir) = fs::canonicalize(dir) else {
        return Ok(());
    };
    let mut below: Vec<PathBuf> = mounts()?
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(&dir))
        .collect();
    below.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in below {
        unmount(&point)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - tmpfs tmpfs rw,size=1024k\n\
                    22 1 8:1 / / rw - ext4 /dev/sda1 rw\n";
        let entries = parse_mountinfo(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(entries[0].fs_type, "tmpfs");
        assert_eq!(entries[0].super_options, "rw,size=1024k");
        assert_eq!(entries[1].mount_point, PathBuf::from("/"));
    }
}
