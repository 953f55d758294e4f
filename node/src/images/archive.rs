//! Reading an image tarball (an OCI image layout, or a docker archive as `docker save` and
//! `skopeo copy docker-archive:` write it) into the set of blobs and named roots an import
//! writes to containerd. Nothing is written here: the whole archive is checked first.
//!
//! A tarball is untrusted input. Entry paths must be relative and stay inside the archive;
//! entries are counted ([`MAX_ENTRIES`]); JSON documents are size-bounded
//! ([`MAX_JSON_SIZE`]); every blob's sha256 and size are checked against its descriptor, and a
//! docker layer's uncompressed sha256 against the config's `rootfs.diff_ids`. A gzip-compressed
//! tarball is first inflated to a spool file, bounded by [`MAX_INFLATED_SIZE`].
//!
//! A docker archive has no manifests: each `manifest.json` entry becomes an OCI image manifest
//! whose config is the archive's config file byte for byte (its sha256 is docker's image id)
//! and whose layers are the archive's layer files as they are (`.tar` or `.tar+gzip`), so every
//! digest is exact and CRI reports the image id docker would.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::reference;

/// The most entries an archive may hold: an OCI layout has about one per blob, a docker
/// archive three or four per layer, so this is thousands of layers.
pub const MAX_ENTRIES: usize = 10_000;

/// The largest manifest, index, config or `manifest.json`: the 4 MiB docker's registry accepts
/// for a manifest (distribution's `registry/handlers/manifests.go`, `maxManifestBodySize`).
pub const MAX_JSON_SIZE: u64 = 4 * 1024 * 1024;

/// The most a gzip-compressed tarball may inflate to (a spool file on disk): bigger than any
/// image an edge node runs, small enough that a gzip bomb cannot fill the node's disk.
pub const MAX_INFLATED_SIZE: u64 = 16 * 1024 * 1024 * 1024;

/// The deepest chain of indexes (an index of indexes...) followed.
const MAX_INDEX_DEPTH: usize = 4;

/// How many symlinks a docker archive's layer path may go through (older `docker save` links
/// a repeated layer to its first copy).
const MAX_SYMLINKS: usize = 8;

pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MEDIA_OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The annotation containerd and docker 25+ put the full image name in.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The OCI annotation of a reference name (a full name, or only a tag).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// What is wrong with an archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a valid image archive: {why}")]
    Invalid { path: PathBuf, why: String },
}

/// An OCI content descriptor.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<serde_json::Value>,
}

/// An archive's blobs (children before parents) and its `(name, root)` pairs.
type Contents = (Vec<Blob>, Vec<(String, Descriptor)>);

/// Where a blob's bytes are.
#[derive(Clone, Debug)]
pub enum BlobData {
    /// A slice of the (inflated) archive.
    Archive { offset: u64 },
    /// Made by the import (a converted docker manifest).
    Memory(Vec<u8>),
}

/// One blob to write, already verified.
#[derive(Clone, Debug)]
pub struct Blob {
    pub digest: String,
    pub size: u64,
    pub data: BlobData,
    /// containerd's garbage-collection labels: what this blob keeps alive.
    pub gc_labels: BTreeMap<String, String>,
}

/// A checked archive: its blobs and the names to give to its roots.
#[derive(Debug)]
pub struct ImageArchive {
    /// The plain tar the blobs are read from (the archive, or its inflated spool).
    pub tar_path: PathBuf,
    /// Every blob, by digest, in the order they should be written (children before parents).
    pub blobs: Vec<Blob>,
    /// `(normalized name, root descriptor)`.
    pub images: Vec<(String, Descriptor)>,
    _spool: Option<tempfile::NamedTempFile>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    offset: u64,
    size: u64,
}

enum Node {
    File(Entry),
    Link(String),
}

struct Reader {
    path: PathBuf,
    file: File,
    entries: HashMap<String, Node>,
}

impl Reader {
    fn invalid(&self, why: impl Into<String>) -> ArchiveError {
        ArchiveError::Invalid {
            path: self.path.clone(),
            why: why.into(),
        }
    }

    fn io(&self, source: io::Error) -> ArchiveError {
        ArchiveError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// The regular file at `name`, following a few symlinks.
    fn entry(&self, name: &str) -> Result<Entry, ArchiveError> {
        let mut name =
            clean_path(name).ok_or_else(|| self.invalid(format!("bad path {name:?}")))?;
        for _ in 0..=MAX_SYMLINKS {
            match self.entries.get(&name) {
                Some(Node::File(entry)) => return Ok(*entry),
                Some(Node::Link(target)) => {
                    let joined = match name.rsplit_once('/') {
                        Some((dir, _)) => format!("{dir}/{target}"),
                        None => target.clone(),
                    };
                    name = clean_path(&joined).ok_or_else(|| {
                        self.invalid(format!("symlink {name:?} leaves the archive"))
                    })?;
                }
                None => return Err(self.invalid(format!("{name:?} is missing"))),
            }
        }
        Err(self.invalid(format!("too many symlinks at {name:?}")))
    }

    fn read_json_bytes(&mut self, entry: Entry, what: &str) -> Result<Vec<u8>, ArchiveError> {
        if entry.size > MAX_JSON_SIZE {
            return Err(self.invalid(format!(
                "{what} is {} bytes, more than the {MAX_JSON_SIZE} allowed",
                entry.size
            )));
        }
        let mut buf = Vec::with_capacity(entry.size as usize);
        self.file
            .seek(SeekFrom::Start(entry.offset))
            .map_err(|e| self.io(e))?;
        (&mut self.file)
            .take(entry.size)
            .read_to_end(&mut buf)
            .map_err(|e| self.io(e))?;
        if buf.len() as u64 != entry.size {
            return Err(self.invalid(format!("{what} is truncated")));
        }
        Ok(buf)
    }

    /// sha256 of an entry, and of its gzip-inflated content when `inflate`.
    fn hash(
        &mut self,
        entry: Entry,
        inflate: bool,
    ) -> Result<(String, Option<String>), ArchiveError> {
        let path = self.path.clone();
        let io_err = |source| ArchiveError::Io {
            path: path.clone(),
            source,
        };
        self.file
            .seek(SeekFrom::Start(entry.offset))
            .map_err(io_err)?;
        let mut raw = HashingReader {
            inner: (&mut self.file).take(entry.size),
            hasher: Sha256::new(),
            read: 0,
        };
        let inflated = if inflate {
            let mut decoder = flate2::read::GzDecoder::new(&mut raw);
            let mut hasher = HashWriter(Sha256::new());
            io::copy(&mut decoder, &mut hasher).map_err(|e| ArchiveError::Invalid {
                path: path.clone(),
                why: format!("a gzip layer does not inflate: {e}"),
            })?;
            // Whatever follows the gzip stream still counts toward the blob's digest.
            io::copy(&mut raw, &mut io::sink()).map_err(io_err)?;
            Some(hex_digest(hasher.0))
        } else {
            io::copy(&mut raw, &mut io::sink()).map_err(io_err)?;
            None
        };
        if raw.read != entry.size {
            return Err(ArchiveError::Invalid {
                path,
                why: "an entry is truncated".into(),
            });
        }
        Ok((hex_digest(raw.hasher), inflated))
    }

    fn is_gzip(&mut self, entry: Entry) -> Result<bool, ArchiveError> {
        let mut magic = [0u8; 2];
        if entry.size < 2 {
            return Ok(false);
        }
        self.file
            .seek(SeekFrom::Start(entry.offset))
            .map_err(|e| self.io(e))?;
        self.file.read_exact(&mut magic).map_err(|e| self.io(e))?;
        Ok(magic == [0x1f, 0x8b])
    }
}

struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `sha256:<hex>` of a finished hasher.
pub fn hex_digest(hasher: Sha256) -> String {
    let digest = hasher.finalize();
    let mut out = String::with_capacity(71);
    out.push_str("sha256:");
    for b in digest {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
    }
    out
}

/// `sha256:<hex>` of `data`.
pub fn sha256(data: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(data);
    hex_digest(hasher)
}

/// A relative path without `.`/`..` escapes, `./` and trailing `/` removed; `None` when it is
/// absolute or climbs out.
fn clean_path(path: &str) -> Option<String> {
    if path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(parts.join("/"))
}

fn valid_sha256(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

/// Reads and checks the archive at `path`.
pub fn read(path: &Path) -> Result<ImageArchive, ArchiveError> {
    let io_err = |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(io_err)?;
    file.seek(SeekFrom::Start(0)).map_err(io_err)?;
    let (file, tar_path, spool) = if n == 2 && magic == [0x1f, 0x8b] {
        let spool = inflate_to_spool(path, file)?;
        let reopened = spool.reopen().map_err(io_err)?;
        (reopened, spool.path().to_path_buf(), Some(spool))
    } else {
        (file, path.to_path_buf(), None)
    };
    let mut reader = index(path, file)?;
    let (blobs, images) = if reader.entries.contains_key("index.json") {
        read_oci_layout(&mut reader)?
    } else if reader.entries.contains_key("manifest.json") {
        read_docker_archive(&mut reader)?
    } else {
        return Err(reader.invalid(
            "neither an OCI image layout (index.json) nor a docker archive (manifest.json)",
        ));
    };
    if images.is_empty() {
        return Err(reader.invalid("it names no image"));
    }
    Ok(ImageArchive {
        tar_path,
        blobs,
        images,
        _spool: spool,
    })
}

fn inflate_to_spool(path: &Path, file: File) -> Result<tempfile::NamedTempFile, ArchiveError> {
    let io_err = |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    };
    // Beside the archive: the same filesystem as the images folder, not a small /tmp.
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut spool = tempfile::Builder::new()
        .prefix(".skerry-inflate-")
        .tempfile_in(dir)
        .or_else(|_| tempfile::NamedTempFile::new())
        .map_err(io_err)?;
    let mut decoder =
        flate2::read::GzDecoder::new(io::BufReader::new(file)).take(MAX_INFLATED_SIZE + 1);
    let copied =
        io::copy(&mut decoder, spool.as_file_mut()).map_err(|e| ArchiveError::Invalid {
            path: path.to_path_buf(),
            why: format!("gzip: {e}"),
        })?;
    if copied > MAX_INFLATED_SIZE {
        return Err(ArchiveError::Invalid {
            path: path.to_path_buf(),
            why: format!("it inflates to more than {MAX_INFLATED_SIZE} bytes"),
        });
    }
    Ok(spool)
}

/// Lists the tar's entries and where their data is.
fn index(path: &Path, file: File) -> Result<Reader, ArchiveError> {
    let invalid = |why: String| ArchiveError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    let len = file
        .metadata()
        .map_err(|source| ArchiveError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    let mut entries = HashMap::new();
    let mut archive = tar::Archive::new(file);
    let iter = archive
        .entries()
        .map_err(|e| invalid(format!("not a tar archive: {e}")))?;
    for (count, entry) in iter.enumerate() {
        if count >= MAX_ENTRIES {
            return Err(invalid(format!("more than {MAX_ENTRIES} entries")));
        }
        let entry = entry.map_err(|e| invalid(format!("not a tar archive: {e}")))?;
        let raw_name = entry
            .path()
            .map_err(|e| invalid(format!("an entry name is not valid: {e}")))?
            .to_string_lossy()
            .into_owned();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        let name = clean_path(&raw_name)
            .ok_or_else(|| invalid(format!("entry {raw_name:?} leaves the archive")))?;
        let node = if kind.is_file() {
            let offset = entry.raw_file_position();
            let size = entry.size();
            if offset.checked_add(size).is_none_or(|end| end > len) {
                return Err(invalid(format!("entry {name:?} is truncated")));
            }
            Node::File(Entry { offset, size })
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(|e| invalid(format!("symlink {name:?}: {e}")))?
                .ok_or_else(|| invalid(format!("symlink {name:?} has no target")))?
                .to_string_lossy()
                .into_owned();
            if target.starts_with('/') {
                return Err(invalid(format!("symlink {name:?} is absolute")));
            }
            Node::Link(target)
        } else {
            continue;
        };
        if entries.insert(name.clone(), node).is_some() {
            return Err(invalid(format!("entry {name:?} appears twice")));
        }
    }
    let file = archive.into_inner();
    Ok(Reader {
        path: path.to_path_buf(),
        file,
        entries,
    })
}

#[derive(Deserialize)]
struct OciIndex {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct OciManifest {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

struct Collector {
    blobs: Vec<Blob>,
    seen: HashMap<String, usize>,
}

impl Collector {
    fn push(&mut self, blob: Blob) {
        if !self.seen.contains_key(&blob.digest) {
            self.seen.insert(blob.digest.clone(), self.blobs.len());
            self.blobs.push(blob);
        }
    }
}

fn read_oci_layout(reader: &mut Reader) -> Result<Contents, ArchiveError> {
    let entry = reader.entry("index.json")?;
    let bytes = reader.read_json_bytes(entry, "index.json")?;
    let index: OciIndex =
        serde_json::from_slice(&bytes).map_err(|e| reader.invalid(format!("index.json: {e}")))?;
    let mut collector = Collector {
        blobs: Vec::new(),
        seen: HashMap::new(),
    };
    let mut images = Vec::new();
    for desc in index.manifests {
        let name = match desc
            .annotations
            .get(ANNOTATION_CONTAINERD_NAME)
            .or_else(|| desc.annotations.get(ANNOTATION_REF_NAME))
        {
            Some(name) if name.contains(['/', ':', '@']) => {
                reference::normalize(name).map_err(|e| reader.invalid(e.to_string()))?
            }
            Some(tag) => {
                return Err(reader.invalid(format!(
                    "index.json names an image only by the tag {tag:?}: give it a full name \
                     (for example skopeo copy ... oci-archive:FILE:NAME:TAG)"
                )));
            }
            None => continue,
        };
        walk(reader, &mut collector, &desc, 0)?;
        let mut target = desc.clone();
        target.annotations.clear();
        target.platform = None;
        images.push((name, target));
    }
    Ok((collector.blobs, images))
}

/// Checks the blob `desc` names and what it refers to, children first.
fn walk(
    reader: &mut Reader,
    collector: &mut Collector,
    desc: &Descriptor,
    depth: usize,
) -> Result<(), ArchiveError> {
    if collector.seen.contains_key(&desc.digest) {
        return Ok(());
    }
    let entry = blob_entry(reader, desc)?;
    let mut gc_labels = BTreeMap::new();
    match desc.media_type.as_str() {
        MEDIA_OCI_INDEX | MEDIA_DOCKER_LIST => {
            if depth >= MAX_INDEX_DEPTH {
                return Err(reader.invalid("indexes nest too deep"));
            }
            let bytes = reader.read_json_bytes(entry, &desc.digest)?;
            check_digest(reader, desc, &bytes)?;
            let index: OciIndex = serde_json::from_slice(&bytes)
                .map_err(|e| reader.invalid(format!("index {}: {e}", desc.digest)))?;
            let mut present = 0;
            for (i, child) in index.manifests.iter().enumerate() {
                // A multi-platform index saved with only some platforms: the others are absent.
                if valid_sha256(&child.digest)
                    .is_some_and(|hex| reader.entries.contains_key(&format!("blobs/sha256/{hex}")))
                {
                    walk(reader, collector, child, depth + 1)?;
                    present += 1;
                }
                gc_labels.insert(
                    format!("containerd.io/gc.ref.content.m.{i}"),
                    child.digest.clone(),
                );
            }
            if present == 0 {
                return Err(
                    reader.invalid(format!("index {} holds none of its manifests", desc.digest))
                );
            }
        }
        MEDIA_OCI_MANIFEST | MEDIA_DOCKER_MANIFEST => {
            let bytes = reader.read_json_bytes(entry, &desc.digest)?;
            check_digest(reader, desc, &bytes)?;
            let manifest: OciManifest = serde_json::from_slice(&bytes)
                .map_err(|e| reader.invalid(format!("manifest {}: {e}", desc.digest)))?;
            let config_entry = blob_entry(reader, &manifest.config)?;
            let config = reader.read_json_bytes(config_entry, &manifest.config.digest)?;
            check_digest(reader, &manifest.config, &config)?;
            collector.push(Blob {
                digest: manifest.config.digest.clone(),
                size: manifest.config.size,
                data: BlobData::Archive {
                    offset: config_entry.offset,
                },
                gc_labels: BTreeMap::new(),
            });
            gc_labels.insert(
                "containerd.io/gc.ref.content.config".to_string(),
                manifest.config.digest.clone(),
            );
            for (i, layer) in manifest.layers.iter().enumerate() {
                let layer_entry = blob_entry(reader, layer)?;
                let (digest, _) = reader.hash(layer_entry, false)?;
                if digest != layer.digest {
                    return Err(
                        reader.invalid(format!("layer {} has the digest {digest}", layer.digest))
                    );
                }
                collector.push(Blob {
                    digest: layer.digest.clone(),
                    size: layer.size,
                    data: BlobData::Archive {
                        offset: layer_entry.offset,
                    },
                    gc_labels: BTreeMap::new(),
                });
                gc_labels.insert(
                    format!("containerd.io/gc.ref.content.l.{i}"),
                    layer.digest.clone(),
                );
            }
        }
        other => {
            return Err(reader.invalid(format!(
                "{} has the media type {other:?}, not an image manifest or index",
                desc.digest
            )));
        }
    }
    collector.push(Blob {
        digest: desc.digest.clone(),
        size: desc.size,
        data: BlobData::Archive {
            offset: entry.offset,
        },
        gc_labels,
    });
    Ok(())
}

/// The entry of the blob `desc` names, its size checked.
fn blob_entry(reader: &Reader, desc: &Descriptor) -> Result<Entry, ArchiveError> {
    let hex = valid_sha256(&desc.digest)
        .ok_or_else(|| reader.invalid(format!("unsupported digest {:?}", desc.digest)))?;
    let entry = reader.entry(&format!("blobs/sha256/{hex}"))?;
    if entry.size != desc.size {
        return Err(reader.invalid(format!(
            "blob {} is {} bytes, its descriptor says {}",
            desc.digest, entry.size, desc.size
        )));
    }
    Ok(entry)
}

fn check_digest(reader: &Reader, desc: &Descriptor, bytes: &[u8]) -> Result<(), ArchiveError> {
    let actual = sha256(bytes);
    if actual != desc.digest {
        return Err(reader.invalid(format!("blob {} has the digest {actual}", desc.digest)));
    }
    Ok(())
}

#[derive(Deserialize)]
struct DockerManifestEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct DockerConfig {
    rootfs: DockerRootfs,
}

#[derive(Deserialize)]
struct DockerRootfs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

#[derive(Serialize)]
struct OutManifest<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

fn read_docker_archive(reader: &mut Reader) -> Result<Contents, ArchiveError> {
    let entry = reader.entry("manifest.json")?;
    let bytes = reader.read_json_bytes(entry, "manifest.json")?;
    let manifest: Vec<DockerManifestEntry> = serde_json::from_slice(&bytes)
        .map_err(|e| reader.invalid(format!("manifest.json: {e}")))?;
    let mut collector = Collector {
        blobs: Vec::new(),
        seen: HashMap::new(),
    };
    let mut images = Vec::new();
    for image in manifest {
        let tags = image.repo_tags.unwrap_or_default();
        if tags.is_empty() {
            return Err(reader.invalid(format!(
                "image {} has no RepoTags: nothing to name it by",
                image.config
            )));
        }
        let config_entry = reader.entry(&image.config)?;
        let config_bytes = reader.read_json_bytes(config_entry, &image.config)?;
        let config: DockerConfig = serde_json::from_slice(&config_bytes)
            .map_err(|e| reader.invalid(format!("config {}: {e}", image.config)))?;
        if config.rootfs.diff_ids.len() != image.layers.len() {
            return Err(reader.invalid(format!(
                "config {} lists {} layers, manifest.json {}",
                image.config,
                config.rootfs.diff_ids.len(),
                image.layers.len()
            )));
        }
        let config_desc = Descriptor {
            media_type: MEDIA_OCI_CONFIG.to_string(),
            digest: sha256(&config_bytes),
            size: config_entry.size,
            ..Default::default()
        };
        collector.push(Blob {
            digest: config_desc.digest.clone(),
            size: config_desc.size,
            data: BlobData::Archive {
                offset: config_entry.offset,
            },
            gc_labels: BTreeMap::new(),
        });
        let mut layers = Vec::new();
        let mut gc_labels = BTreeMap::new();
        gc_labels.insert(
            "containerd.io/gc.ref.content.config".to_string(),
            config_desc.digest.clone(),
        );
        for (i, (layer, diff_id)) in image.layers.iter().zip(&config.rootfs.diff_ids).enumerate() {
            let layer_entry = reader.entry(layer)?;
            let gzip = reader.is_gzip(layer_entry)?;
            let (digest, inflated) = reader.hash(layer_entry, gzip)?;
            let uncompressed = inflated.as_deref().unwrap_or(&digest);
            if uncompressed != diff_id {
                return Err(reader.invalid(format!(
                    "layer {layer} has the content digest {uncompressed}, the config says {diff_id}"
                )));
            }
            let desc = Descriptor {
                media_type: if gzip {
                    MEDIA_OCI_LAYER_GZIP
                } else {
                    MEDIA_OCI_LAYER
                }
                .to_string(),
                digest: digest.clone(),
                size: layer_entry.size,
                ..Default::default()
            };
            gc_labels.insert(
                format!("containerd.io/gc.ref.content.l.{i}"),
                digest.clone(),
            );
            collector.push(Blob {
                digest,
                size: layer_entry.size,
                data: BlobData::Archive {
                    offset: layer_entry.offset,
                },
                gc_labels: BTreeMap::new(),
            });
            layers.push(desc);
        }
        let manifest_bytes = serde_json::to_vec(&OutManifest {
            schema_version: 2,
            media_type: MEDIA_OCI_MANIFEST,
            config: config_desc,
            layers,
        })
        .map_err(|e| reader.invalid(format!("encoding a manifest: {e}")))?;
        let target = Descriptor {
            media_type: MEDIA_OCI_MANIFEST.to_string(),
            digest: sha256(&manifest_bytes),
            size: manifest_bytes.len() as u64,
            ..Default::default()
        };
        collector.push(Blob {
            digest: target.digest.clone(),
            size: target.size,
            data: BlobData::Memory(manifest_bytes),
            gc_labels,
        });
        for tag in tags {
            let name = reference::normalize(&tag).map_err(|e| reader.invalid(e.to_string()))?;
            images.push((name, target.clone()));
        }
    }
    Ok((collector.blobs, images))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside() {
        assert_eq!(
            clean_path("./blobs/sha256/ab").as_deref(),
            Some("blobs/sha256/ab")
        );
        assert_eq!(clean_path("a/../b").as_deref(), Some("b"));
        assert_eq!(clean_path("../etc/passwd"), None);
        assert_eq!(clean_path("/etc/passwd"), None);
        assert_eq!(clean_path("."), None);
    }
}
