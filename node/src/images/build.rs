//! A builder of small images from files on the host, written as a deterministic OCI image
//! layout tarball: the same inputs give the same bytes, so the same digests, on every node.
//!
//! Used for the pod sandbox ("pause") image, Debian's static `catatonit` as `/pause` run in its
//! pause mode, which skerry imports at start under [`PAUSE_IMAGE`], and for the tests' busybox
//! image from Debian's `busybox-static`. One gzip layer; every tar header has mtime 0 and owner
//! root; entries are sorted; the gzip header carries no time or name.

use std::collections::BTreeMap;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use serde_json::json;

use super::archive::{
    ANNOTATION_CONTAINERD_NAME, ANNOTATION_REF_NAME, MEDIA_OCI_CONFIG, MEDIA_OCI_INDEX,
    MEDIA_OCI_LAYER_GZIP, MEDIA_OCI_MANIFEST, sha256,
};
use super::reference;

/// skerry's pod sandbox image: built from catatonit on the node, never pulled. The default of
/// `--pod-infra-container-image` (upstream's is `registry.k8s.io/pause:3.10`); the `.local`
/// domain cannot be pulled from the internet, so a node missing it fails loudly.
pub const PAUSE_IMAGE: &str = "skerry.local/pause:1";

/// Where Debian's `catatonit` package puts its static binary.
pub const CATATONIT: &str = "/usr/bin/catatonit";

/// Where Debian's `busybox-static` package puts its binary.
pub const BUSYBOX: &str = "/usr/bin/busybox";

/// catatonit's pause mode: it sleeps until signalled, reaping nothing (`catatonit -P`).
const CATATONIT_PAUSE_FLAG: &str = "-P";

/// The busybox applets the test image links, enough for shells, servers and probes.
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "ash", "httpd", "sleep", "cat", "echo", "wget", "nc", "ls", "mkdir", "rm", "env", "ps",
    "kill", "true", "false", "test", "[", "printf", "date", "id", "hostname", "grep", "sed",
    "head", "tail", "wc", "touch", "cp", "mv", "ln", "pwd", "uname", "whoami", "seq", "sort",
    "tee", "timeout", "stat", "chmod", "find", "xargs", "nslookup", "ping", "ip", "mount", "df",
    "tar", "readlink", "stty", "tty",
];

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{path}: {source} (install the Debian package {package})")]
    MissingInput {
        path: PathBuf,
        package: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} is dynamically linked; an image needs the static build (Debian package {package})"
    )]
    NotStatic {
        path: PathBuf,
        package: &'static str,
    },
    #[error("{0}")]
    Reference(#[from] reference::ReferenceError),
    #[error("building the image: {0}")]
    Io(#[from] io::Error),
}

enum Node {
    File { data: Vec<u8>, mode: u32 },
    Dir { mode: u32 },
    Symlink { target: String },
}

/// An image being built: a filesystem and an entrypoint.
pub struct ImageBuilder {
    name: String,
    files: BTreeMap<String, Node>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: Vec<String>,
}

impl ImageBuilder {
    /// An empty image to be named `name`.
    pub fn new(name: &str) -> Result<Self, BuildError> {
        Ok(Self {
            name: reference::normalize(name)?,
            files: BTreeMap::new(),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        })
    }

    /// The normalized name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn parents(&mut self, path: &str) {
        let mut dir = String::new();
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !dir.is_empty() {
                dir.push('/');
            }
            dir.push_str(part);
            self.files
                .entry(dir.clone())
                .or_insert(Node::Dir { mode: 0o755 });
        }
    }

    /// Adds a file with `data` at `path` (absolute in the image).
    pub fn file(&mut self, path: &str, data: Vec<u8>, mode: u32) -> &mut Self {
        self.parents(path);
        self.files.insert(
            path.trim_start_matches('/').to_string(),
            Node::File { data, mode },
        );
        self
    }

    /// Adds a directory.
    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        self.parents(path);
        self.files
            .insert(path.trim_start_matches('/').to_string(), Node::Dir { mode });
        self
    }

    /// Adds a symlink at `path` to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.parents(path);
        self.files.insert(
            path.trim_start_matches('/').to_string(),
            Node::Symlink {
                target: target.to_string(),
            },
        );
        self
    }

    /// Sets the entrypoint.
    pub fn entrypoint(&mut self, entrypoint: &[&str]) -> &mut Self {
        self.entrypoint = entrypoint.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Sets the default command.
    pub fn cmd(&mut self, cmd: &[&str]) -> &mut Self {
        self.cmd = cmd.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The OCI layout tarball of this image.
    pub fn to_oci_archive(&self) -> Result<Vec<u8>, BuildError> {
        let layer_tar = self.layer_tar()?;
        let diff_id = sha256(&layer_tar);
        let mut gz = flate2::GzBuilder::new()
            .operating_system(255)
            .write(Vec::new(), flate2::Compression::default());
        gz.write_all(&layer_tar)?;
        let layer = gz.finish()?;
        let (os, arch) = platform();
        let config = json!({
            "created": "1970-01-01T00:00:00Z",
            "architecture": arch,
            "os": os,
            "config": {
                "Env": self.env,
                "Entrypoint": if self.entrypoint.is_empty() { None } else { Some(&self.entrypoint) },
                "Cmd": if self.cmd.is_empty() { None } else { Some(&self.cmd) },
                "WorkingDir": "/",
            },
            "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        });
        let config = serde_json::to_vec(&config).map_err(io::Error::other)?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_OCI_MANIFEST,
            "config": { "mediaType": MEDIA_OCI_CONFIG, "digest": sha256(&config), "size": config.len() },
            "layers": [{ "mediaType": MEDIA_OCI_LAYER_GZIP, "digest": sha256(&layer), "size": layer.len() }],
        });
        let manifest = serde_json::to_vec(&manifest).map_err(io::Error::other)?;
        let index = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_OCI_INDEX,
            "manifests": [{
                "mediaType": MEDIA_OCI_MANIFEST,
                "digest": sha256(&manifest),
                "size": manifest.len(),
                "annotations": {
                    ANNOTATION_CONTAINERD_NAME: self.name,
                    ANNOTATION_REF_NAME: self.name,
                },
                "platform": { "architecture": arch, "os": os },
            }],
        });
        let index = serde_json::to_vec(&index).map_err(io::Error::other)?;
        let mut out = tar::Builder::new(Vec::new());
        let mut entries: Vec<(String, &[u8])> = vec![
            ("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#),
            ("index.json".into(), &index),
        ];
        let mut blobs: Vec<(String, &[u8])> = [&config, &manifest, &layer]
            .into_iter()
            .map(|blob| (blob_path(blob), blob.as_slice()))
            .collect();
        blobs.sort();
        entries.extend(blobs);
        for dir in ["blobs", "blobs/sha256"] {
            let mut header = header(tar::EntryType::Directory, 0o755, 0);
            out.append_data(&mut header, dir, io::empty())?;
        }
        for (path, data) in entries {
            let mut header = header(tar::EntryType::Regular, 0o644, data.len() as u64);
            out.append_data(&mut header, path, data)?;
        }
        Ok(out.into_inner()?)
    }

    /// Writes the OCI layout tarball to `path`.
    pub fn write_oci_archive(&self, path: &Path) -> Result<(), BuildError> {
        std::fs::write(path, self.to_oci_archive()?)?;
        Ok(())
    }

    fn layer_tar(&self) -> Result<Vec<u8>, BuildError> {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, node) in &self.files {
            match node {
                Node::Dir { mode } => {
                    let mut header = header(tar::EntryType::Directory, *mode, 0);
                    tar.append_data(&mut header, format!("{path}/"), io::empty())?;
                }
                Node::File { data, mode } => {
                    let mut header = header(tar::EntryType::Regular, *mode, data.len() as u64);
                    tar.append_data(&mut header, path, data.as_slice())?;
                }
                Node::Symlink { target } => {
                    let mut header = header(tar::EntryType::Symlink, 0o777, 0);
                    tar.append_link(&mut header, path, target)?;
                }
            }
        }
        Ok(tar.into_inner()?)
    }
}

fn blob_path(blob: &[u8]) -> String {
    let digest = sha256(blob);
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(size);
    header
}

/// The OCI `os` and `architecture` of this machine (GOARCH names, which containerd matches).
pub fn platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "riscv64" => "riscv64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => other,
    };
    ("linux", arch)
}

/// Reads a static executable for an image; a clear error when it is missing or dynamic.
fn read_static(path: &Path, package: &'static str) -> Result<Vec<u8>, BuildError> {
    let data = std::fs::read(path).map_err(|source| BuildError::MissingInput {
        path: path.to_path_buf(),
        package,
        source,
    })?;
    if has_interpreter(&data) {
        return Err(BuildError::NotStatic {
            path: path.to_path_buf(),
            package,
        });
    }
    Ok(data)
}

/// Whether an ELF file asks for a dynamic loader (a `PT_INTERP` program header).
fn has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        // Not a little-endian ELF64: let the runtime say what is wrong.
        return false;
    }
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..usize::from(phnum)).any(|i| {
        let offset = usize::try_from(phoff)
            .unwrap_or(usize::MAX)
            .saturating_add(i.saturating_mul(usize::from(phentsize)));
        u32_at(offset) == Some(PT_INTERP)
    })
}

/// The pause image: `/pause` is catatonit (read from `catatonit`), run as `/pause -P`.
pub fn pause_image(catatonit: &Path) -> Result<ImageBuilder, BuildError> {
    let binary = read_static(catatonit, "catatonit")?;
    let mut image = ImageBuilder::new(PAUSE_IMAGE)?;
    image
        .file("/pause", binary, 0o755)
        .entrypoint(&["/pause", CATATONIT_PAUSE_FLAG]);
    Ok(image)
}

/// A busybox image named `name`: `/bin/busybox` from `busybox` with [`BUSYBOX_APPLETS`]
/// linked to it, `/tmp`, and `sh` as the default command.
pub fn busybox_image(busybox: &Path, name: &str) -> Result<ImageBuilder, BuildError> {
    let binary = read_static(busybox, "busybox-static")?;
    let mut image = ImageBuilder::new(name)?;
    image.file("/bin/busybox", binary, 0o755);
    for applet in BUSYBOX_APPLETS {
        image.symlink(&format!("/bin/{applet}"), "busybox");
    }
    image
        .dir("/tmp", 0o1777)
        .dir("/var/www", 0o755)
        .file(
            "/etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
                .to_vec(),
            0o644,
        )
        .file(
            "/etc/group",
            b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
            0o644,
        )
        .cmd(&["sh"]);
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_are_deterministic_and_readable() {
        let build = || {
            let mut image = ImageBuilder::new("example.test/app:1").expect("name");
            image
                .file("/bin/app", b"#!/bin/sh\n".to_vec(), 0o755)
                .symlink("/bin/alias", "app")
                .entrypoint(&["/bin/app"]);
            image.to_oci_archive().expect("build")
        };
        let first = build();
        assert_eq!(first, build(), "the same inputs give the same bytes");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("app.tar");
        std::fs::write(&path, &first).expect("write");
        let archive = super::super::archive::read(&path).expect("our own archive reads back");
        assert_eq!(archive.images.len(), 1);
        assert_eq!(archive.images[0].0, "example.test/app:1");
        assert_eq!(archive.blobs.len(), 3, "config, layer, manifest");
    }

    #[test]
    fn dynamic_binaries_are_refused() {
        // /bin/sh on any Debian is dynamically linked.
        let sh = std::fs::read("/bin/sh").expect("/bin/sh");
        assert!(has_interpreter(&sh));
        if let Ok(catatonit) = std::fs::read(CATATONIT) {
            assert!(!has_interpreter(&catatonit), "Debian's catatonit is static");
        }
    }
}
