//! Snapshots: the whole store as one stream, and restoring a data dir from it.
//!
//! Format (all integers big-endian):
//! ```text
//! magic    "SKERRY-SNAPSHOT\n"            16 bytes
//! version  u32 = 1
//! records  tag u8, key_len u32, key, value_len u32, value   (tag 1 meta, 2 kv row, 3 lease)
//! end      tag u8 = 0
//! padding  zero bytes up to a multiple of 512
//! digest   sha256 of every byte before it  32 bytes
//! ```
//! The padding and digest are what `etcdctl snapshot save` checks for: it refuses a stream
//! whose length is not a multiple of 512 plus a 32-byte sha256 (etcd's own snapshots are
//! whole database pages followed by the digest).
//! A snapshot is written from one redb read transaction, so it is consistent at one revision
//! while writes go on. Restore verifies the digest before it commits anything.

use std::io::{Read, Write};
use std::path::Path;

use redb::{ReadTransaction, ReadableTable};
use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::mvcc::{
    self, KV, LEASES, META, META_APPLIED_INDEX, META_CLUSTER_ID, META_COMPACT_FINISHED,
    META_MEMBER_ID, META_REVISION,
};

pub const SNAPSHOT_MAGIC: &[u8; 16] = b"SKERRY-SNAPSHOT\n";
pub const SNAPSHOT_VERSION: u32 = 1;
const TAG_END: u8 = 0;
const TAG_META: u8 = 1;
const TAG_KV: u8 = 2;
const TAG_LEASE: u8 = 3;
const DIGEST_BYTES: usize = 32;
/// The body is padded to a multiple of this before the digest (see the module docs).
const BODY_ALIGN_BYTES: u64 = 512;

/// A record's key or value longer than this is not from a skerry snapshot (the largest row is
/// one request, at most 1.5 MiB). Bounds what a hostile file can make restore allocate.
const RECORD_FIELD_BYTES_MAX: u32 = 64 * 1024 * 1024;

/// Meta entries that describe this member rather than the data: not carried by a snapshot.
const MEMBER_META: [&str; 3] = [META_CLUSTER_ID, META_MEMBER_ID, META_APPLIED_INDEX];

struct HashingWriter<'w, W: Write> {
    inner: &'w mut W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<'_, W> {
    fn record(&mut self, tag: u8, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let mut head = [0u8; 5];
        head[0] = tag;
        head[1..].copy_from_slice(&len32(key)?.to_be_bytes());
        self.write(&head)?;
        self.write(key)?;
        self.write(&len32(value)?.to_be_bytes())?;
        self.write(value)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        self.hasher.update(bytes);
        self.inner.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }
}

fn len32(bytes: &[u8]) -> Result<u32, StoreError> {
    u32::try_from(bytes.len()).map_err(|_| StoreError::Storage("snapshot record too large".into()))
}

/// Writes the snapshot of `txn`'s view; returns the revision it holds.
pub fn write(txn: &ReadTransaction, out: &mut impl Write) -> Result<i64, StoreError> {
    let mut w = HashingWriter {
        inner: out,
        hasher: Sha256::new(),
        written: 0,
    };
    w.write(SNAPSHOT_MAGIC)?;
    w.write(&SNAPSHOT_VERSION.to_be_bytes())?;
    let meta = txn.open_table(META)?;
    let mut revision = 0;
    for row in meta.iter()? {
        let (key, value) = row?;
        if MEMBER_META.contains(&key.value()) {
            continue;
        }
        if key.value() == META_REVISION {
            revision = i64::try_from(value.value()).unwrap_or(0);
        }
        w.record(
            TAG_META,
            key.value().as_bytes(),
            &value.value().to_be_bytes(),
        )?;
    }
    let kv = txn.open_table(KV)?;
    for row in kv.iter()? {
        let (key, value) = row?;
        let (main, sub) = key.value();
        let mut rev = [0u8; 16];
        rev[..8].copy_from_slice(&main.to_be_bytes());
        rev[8..].copy_from_slice(&sub.to_be_bytes());
        w.record(TAG_KV, &rev, value.value())?;
    }
    let leases = txn.open_table(LEASES)?;
    for row in leases.iter()? {
        let (id, ttl) = row?;
        w.record(
            TAG_LEASE,
            &id.value().to_be_bytes(),
            &ttl.value().to_be_bytes(),
        )?;
    }
    w.write(&[TAG_END])?;
    let padding = (BODY_ALIGN_BYTES - w.written % BODY_ALIGN_BYTES) % BODY_ALIGN_BYTES;
    w.write(&vec![0u8; padding as usize])?;
    let digest = w.hasher.finalize();
    w.inner.write_all(&digest)?;
    Ok(revision)
}

/// Reads records of a snapshot whose digest [`verify`] has already checked.
struct RecordReader<R: Read> {
    inner: R,
}

impl<R: Read> RecordReader<R> {
    fn exact(&mut self, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_exact(buf).map_err(|e| {
            StoreError::DataDir(format!("snapshot is truncated or unreadable: {e}"))
        })?;
        Ok(())
    }

    fn field(&mut self) -> Result<Vec<u8>, StoreError> {
        let mut len = [0u8; 4];
        self.exact(&mut len)?;
        let len = u32::from_be_bytes(len);
        if len > RECORD_FIELD_BYTES_MAX {
            return Err(StoreError::DataDir(format!(
                "snapshot record of {len} bytes is not valid"
            )));
        }
        let mut buf = vec![0u8; len as usize];
        self.exact(&mut buf)?;
        Ok(buf)
    }
}

fn be_u64(bytes: &[u8]) -> Result<u64, StoreError> {
    let array: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StoreError::DataDir("snapshot holds a malformed number".into()))?;
    Ok(u64::from_be_bytes(array))
}

/// Creates a new data dir from a snapshot file. The data dir must not hold a store already.
/// The restored member gets new cluster and member ids, as `etcdctl snapshot restore` does.
pub fn restore(snapshot: &Path, data_dir: &Path) -> Result<i64, StoreError> {
    let file = std::fs::File::open(snapshot).map_err(|e| {
        StoreError::DataDir(format!("cannot open snapshot {}: {e}", snapshot.display()))
    })?;
    let db_path = data_dir.join(crate::store::DB_FILE_NAME);
    if db_path.exists() {
        return Err(StoreError::DataDir(format!(
            "data dir {} already holds a store; restore into a new one",
            data_dir.display()
        )));
    }
    verify(snapshot)?;
    std::fs::create_dir_all(data_dir)?;
    let mut r = RecordReader {
        inner: std::io::BufReader::new(file),
    };
    let mut magic = [0u8; 16];
    r.exact(&mut magic)?;
    if &magic != SNAPSHOT_MAGIC {
        return Err(StoreError::DataDir(format!(
            "{} is not a skerry snapshot",
            snapshot.display()
        )));
    }
    let mut version = [0u8; 4];
    r.exact(&mut version)?;
    if u32::from_be_bytes(version) != SNAPSHOT_VERSION {
        return Err(StoreError::DataDir(
            "snapshot version is not one this skerry reads".into(),
        ));
    }
    let tmp_path = data_dir.join(".restore.redb.tmp");
    let _ = std::fs::remove_file(&tmp_path);
    let db = redb::Database::create(&tmp_path)?;
    let txn = db.begin_write()?;
    let mut revision = 0;
    {
        let mut meta = txn.open_table(META)?;
        let mut kv = txn.open_table(KV)?;
        let mut leases = txn.open_table(LEASES)?;
        loop {
            let mut tag = [0u8; 1];
            r.exact(&mut tag)?;
            if tag[0] == TAG_END {
                break;
            }
            let key = r.field()?;
            let value = r.field()?;
            match tag[0] {
                TAG_META => {
                    let name = std::str::from_utf8(&key).map_err(|_| {
                        StoreError::DataDir("snapshot meta name is not UTF-8".into())
                    })?;
                    let number = be_u64(&value)?;
                    if name == META_REVISION {
                        revision = i64::try_from(number).unwrap_or(0);
                    }
                    meta.insert(name, number)?;
                }
                TAG_KV => {
                    if key.len() != 16 {
                        return Err(StoreError::DataDir(
                            "snapshot kv record has a bad revision".into(),
                        ));
                    }
                    mvcc::decode_row(&value)
                        .map_err(|e| StoreError::DataDir(format!("snapshot kv record: {e}")))?;
                    kv.insert((be_u64(&key[..8])?, be_u64(&key[8..])?), value.as_slice())?;
                }
                TAG_LEASE => {
                    let id = be_u64(&key)? as i64;
                    let ttl = be_u64(&value)? as i64;
                    leases.insert(id, ttl)?;
                }
                other => {
                    return Err(StoreError::DataDir(format!(
                        "snapshot has a record of unknown kind {other}"
                    )));
                }
            }
        }
        meta.insert(META_CLUSTER_ID, rand::random::<u64>() >> 1)?;
        meta.insert(META_MEMBER_ID, rand::random::<u64>() >> 1)?;
        meta.insert(META_APPLIED_INDEX, 0)?;
        if meta.get(META_COMPACT_FINISHED)?.is_none() {
            meta.insert(META_COMPACT_FINISHED, 0)?;
        }
    }
    txn.commit()?;
    drop(db);
    std::fs::rename(&tmp_path, &db_path)?;
    Ok(revision)
}

/// A quick check that a file is a complete skerry snapshot: magic and digest.
pub fn verify(snapshot: &Path) -> Result<(), StoreError> {
    let mut file = std::fs::File::open(snapshot)?;
    let len = file.metadata()?.len();
    if len < BODY_ALIGN_BYTES + DIGEST_BYTES as u64 || len % BODY_ALIGN_BYTES != DIGEST_BYTES as u64
    {
        return Err(StoreError::DataDir(format!(
            "snapshot of {len} bytes is truncated or not a skerry snapshot"
        )));
    }
    let mut hasher = Sha256::new();
    let body = len - DIGEST_BYTES as u64;
    let mut reader = (&mut file).take(body);
    std::io::copy(&mut reader, &mut hasher)?;
    let mut digest = [0u8; DIGEST_BYTES];
    file.read_exact(&mut digest)?;
    if hasher.finalize()[..] != digest[..] {
        return Err(StoreError::DataDir(
            "snapshot digest does not match its contents".into(),
        ));
    }
    Ok(())
}
