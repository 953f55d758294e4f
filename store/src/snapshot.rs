//! Snapshots: the whole store as one stream, restoring a data dir from it, and installing it
//! into a cluster member.
//!
//! Format (all integers big-endian):
//! ```text
//! magic    "SKERRY-SNAPSHOT\n"            16 bytes
//! version  u32 = 3 (1 and 2: written before tags 4, 5 and 6 existed; read the same way)
//! records  tag u8, key_len u32, key, value_len u32, value
//! end      tag u8 = 0
//! padding  zero bytes up to a multiple of 512
//! digest   sha256 of every byte before it  32 bytes
//! ```
//! Record tags:
//!
//! | tag | table   | key                          | value                                   |
//! |-----|---------|------------------------------|-----------------------------------------|
//! | 1   | meta    | name (UTF-8)                 | u64                                     |
//! | 2   | kv      | main u64, sub u64            | the row: kind byte + `mvccpb.KeyValue`  |
//! | 3   | leases  | id i64                       | TTL i64 (seconds)                       |
//! | 4   | members | id u64                       | the row: `Member` protobuf              |
//! | 5   | raft    | name (UTF-8)                 | the row's bytes (opaque)                |
//! | 6   | alarms  | alarm type i32, member u64   | empty                                   |
//!
//! Meta records leave out what describes the member rather than the data (cluster id, member
//! id, applied index). Tags 4 and 5 describe the cluster the snapshot came from: installing
//! into a member of that cluster takes them; restoring a new cluster from it skips them.
//! Alarms (tag 6) are kept by both, as etcd's snapshot restore keeps its alarm bucket: a
//! store restored from a snapshot of a store out of space comes up with `NOSPACE` active,
//! until `etcdctl alarm disarm`.
//!
//! The padding and digest are what `etcdctl snapshot save` checks for: it refuses a stream
//! whose length is not a multiple of 512 plus a 32-byte sha256 (etcd's own snapshots are
//! whole database pages followed by the digest).
//! A snapshot is written from one redb read transaction, so it is consistent at one revision
//! while writes go on. Restore and install verify the digest before they commit anything.

use std::io::{Read, Write};
use std::path::Path;

use prost::Message;
use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};
use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::mvcc::{
    self, ALARMS, KV, LEASES, MEMBERS, META, META_APPLIED_INDEX, META_CLUSTER_ID,
    META_COMPACT_FINISHED, META_FORMAT, META_MEMBER_ID, META_REVISION, RAFT, RAFT_SNAPSHOT_INDEX,
    RAFT_SNAPSHOT_TERM,
};
use crate::pb::command::Member;

pub const SNAPSHOT_MAGIC: &[u8; 16] = b"SKERRY-SNAPSHOT\n";
/// The version this build writes.
pub const SNAPSHOT_VERSION: u32 = 3;
/// The oldest version this build reads: versions 1 and 2 are version 3 without tags 4 and 5,
/// and without tag 6.
const SNAPSHOT_VERSION_MIN: u32 = 1;
const TAG_END: u8 = 0;
const TAG_META: u8 = 1;
const TAG_KV: u8 = 2;
const TAG_LEASE: u8 = 3;
const TAG_MEMBER: u8 = 4;
const TAG_RAFT: u8 = 5;
const TAG_ALARM: u8 = 6;
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
    if let Some(members) = mvcc::open_if_exists(txn, MEMBERS)? {
        for row in members.iter()? {
            let (id, value) = row?;
            w.record(TAG_MEMBER, &id.value().to_be_bytes(), value.value())?;
        }
    }
    if let Some(raft) = mvcc::open_if_exists(txn, RAFT)? {
        for row in raft.iter()? {
            let (name, value) = row?;
            w.record(TAG_RAFT, name.value().as_bytes(), value.value())?;
        }
    }
    if let Some(alarms) = mvcc::open_if_exists(txn, ALARMS)? {
        for row in alarms.iter()? {
            let (key, _) = row?;
            w.record(TAG_ALARM, &alarm_key(key.value()), &[])?;
        }
    }
    w.write(&[TAG_END])?;
    let padding = (BODY_ALIGN_BYTES - w.written % BODY_ALIGN_BYTES) % BODY_ALIGN_BYTES;
    w.write(&vec![0u8; padding as usize])?;
    let digest = w.hasher.finalize();
    w.inner.write_all(&digest)?;
    Ok(revision)
}

/// An alarm's record key: its type (i32) then its member (u64), big-endian.
fn alarm_key((kind, member): (i32, u64)) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&kind.to_be_bytes());
    key[4..].copy_from_slice(&member.to_be_bytes());
    key
}

/// One record of a snapshot, checked as far as its own bytes go.
enum Record {
    Meta { name: String, value: u64 },
    Kv { rev: (u64, u64), row: Vec<u8> },
    Lease { id: i64, ttl: i64 },
    Member { id: u64, row: Vec<u8> },
    Raft { name: String, value: Vec<u8> },
    Alarm { kind: i32, member: u64 },
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

    /// The next record, or `None` at the end tag.
    fn next(&mut self) -> Result<Option<Record>, StoreError> {
        let mut tag = [0u8; 1];
        self.exact(&mut tag)?;
        if tag[0] == TAG_END {
            return Ok(None);
        }
        let key = self.field()?;
        let value = self.field()?;
        let record = match tag[0] {
            TAG_META => Record::Meta {
                name: utf8(key, "meta name")?,
                value: be_u64(&value)?,
            },
            TAG_KV => {
                if key.len() != 16 {
                    return Err(StoreError::DataDir(
                        "snapshot kv record has a bad revision".into(),
                    ));
                }
                mvcc::decode_row(&value)
                    .map_err(|e| StoreError::DataDir(format!("snapshot kv record: {e}")))?;
                Record::Kv {
                    rev: (be_u64(&key[..8])?, be_u64(&key[8..])?),
                    row: value,
                }
            }
            TAG_LEASE => Record::Lease {
                id: be_u64(&key)? as i64,
                ttl: be_u64(&value)? as i64,
            },
            TAG_MEMBER => {
                Member::decode(value.as_slice())
                    .map_err(|e| StoreError::DataDir(format!("snapshot member record: {e}")))?;
                Record::Member {
                    id: be_u64(&key)?,
                    row: value,
                }
            }
            TAG_RAFT => Record::Raft {
                name: utf8(key, "raft record name")?,
                value,
            },
            TAG_ALARM => {
                let key: [u8; 12] = key.as_slice().try_into().map_err(|_| {
                    StoreError::DataDir("snapshot alarm record has a bad key".into())
                })?;
                let (kind, member) = key.split_at(4);
                Record::Alarm {
                    kind: i32::from_be_bytes(kind.try_into().map_err(|_| {
                        StoreError::DataDir("snapshot alarm record has a bad type".into())
                    })?),
                    member: be_u64(member)?,
                }
            }
            other => {
                return Err(StoreError::DataDir(format!(
                    "snapshot has a record of unknown kind {other}"
                )));
            }
        };
        Ok(Some(record))
    }
}

fn be_u64(bytes: &[u8]) -> Result<u64, StoreError> {
    let array: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StoreError::DataDir("snapshot holds a malformed number".into()))?;
    Ok(u64::from_be_bytes(array))
}

fn utf8(bytes: Vec<u8>, what: &str) -> Result<String, StoreError> {
    String::from_utf8(bytes)
        .map_err(|_| StoreError::DataDir(format!("snapshot {what} is not UTF-8")))
}

/// Opens a snapshot file, with an error that names it.
fn open_file(path: &Path) -> Result<std::fs::File, StoreError> {
    std::fs::File::open(path)
        .map_err(|e| StoreError::DataDir(format!("cannot open snapshot {}: {e}", path.display())))
}

/// Reads the header of the snapshot `inner` (named `name` in errors): the reader then stands
/// at the first record. The digest is not checked here: call [`verify`] first.
fn read_header<R: Read>(
    inner: R,
    name: &dyn std::fmt::Display,
) -> Result<RecordReader<R>, StoreError> {
    let mut r = RecordReader { inner };
    let mut magic = [0u8; 16];
    r.exact(&mut magic)?;
    if &magic != SNAPSHOT_MAGIC {
        return Err(StoreError::DataDir(format!(
            "{name} is not a skerry snapshot"
        )));
    }
    let mut version = [0u8; 4];
    r.exact(&mut version)?;
    if !(SNAPSHOT_VERSION_MIN..=SNAPSHOT_VERSION).contains(&u32::from_be_bytes(version)) {
        return Err(StoreError::DataDir(
            "snapshot version is not one this skerry reads".into(),
        ));
    }
    Ok(r)
}

/// Creates a new data dir from a snapshot file. The data dir must not hold a store already.
/// The restored member gets new cluster and member ids, as `etcdctl snapshot restore` does,
/// and is the one member of a new cluster: the snapshot's members and Raft records (tags 4
/// and 5) belong to the old cluster and are skipped.
pub fn restore(snapshot: &Path, data_dir: &Path) -> Result<i64, StoreError> {
    let file = open_file(snapshot)?;
    let db_path = data_dir.join(crate::store::DB_FILE_NAME);
    if db_path.exists() {
        return Err(StoreError::DataDir(format!(
            "data dir {} already holds a store; restore into a new one",
            data_dir.display()
        )));
    }
    verify(snapshot)?;
    std::fs::create_dir_all(data_dir)?;
    let mut r = read_header(std::io::BufReader::new(file), &snapshot.display())?;
    let tmp_path = data_dir.join(".restore.redb.tmp");
    let _ = std::fs::remove_file(&tmp_path);
    let db = redb::Database::create(&tmp_path)?;
    let txn = db.begin_write()?;
    let mut revision = 0;
    {
        let mut meta = txn.open_table(META)?;
        let mut kv = txn.open_table(KV)?;
        let mut leases = txn.open_table(LEASES)?;
        let mut alarms = txn.open_table(ALARMS)?;
        while let Some(record) = r.next()? {
            match record {
                Record::Meta { name, value } => {
                    if name == META_REVISION {
                        revision = i64::try_from(value).unwrap_or(0);
                    }
                    meta.insert(name.as_str(), value)?;
                }
                Record::Kv { rev, row } => {
                    kv.insert(rev, row.as_slice())?;
                }
                Record::Lease { id, ttl } => {
                    leases.insert(id, ttl)?;
                }
                Record::Alarm { kind, member } => {
                    alarms.insert((kind, member), ())?;
                }
                Record::Member { .. } | Record::Raft { .. } => {}
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

/// Replaces everything `txn` holds with the snapshot at `path`, for a cluster member taking
/// its leader's snapshot. The member keeps its own identity (format marker, cluster and
/// member ids); every other meta entry, and every row of kv, leases, members and raft, is
/// the snapshot's. The applied index becomes `index`, and `(index, term)` is recorded as the
/// installed snapshot. Returns the snapshot's revision.
///
/// The digest is checked before anything is touched. On an error `txn` holds a partial
/// result and must be dropped, which leaves the store as it was.
pub(crate) fn install(
    txn: &WriteTransaction,
    path: &Path,
    index: u64,
    term: u64,
) -> Result<i64, StoreError> {
    let file = open_file(path)?;
    verify(path)?;
    let records = read_header(std::io::BufReader::new(file), &path.display())?;
    let revision = replace(txn, records, index)?;
    record_installed(txn, index, term)?;
    Ok(revision)
}

/// [`install`] from a snapshot held in memory (the deterministic simulation's
/// [`crate::sync_store::SyncStore`], which has no files).
pub(crate) fn install_bytes(
    txn: &WriteTransaction,
    snapshot: &[u8],
    index: u64,
    term: u64,
) -> Result<i64, StoreError> {
    verify_stream(&mut &snapshot[..], snapshot.len() as u64)?;
    let records = read_header(snapshot, &"the snapshot")?;
    let revision = replace(txn, records, index)?;
    record_installed(txn, index, term)?;
    Ok(revision)
}

/// Rebuilds a member's tables from an image of its own store: a snapshot of it plus the
/// applied index it was taken at, as [`install`] does but without recording an installed
/// snapshot (the image's own raft records say whether there was one). What a power loss
/// leaves of [`crate::sync_store::SyncStore`] is rebuilt this way.
pub(crate) fn restore_image(
    txn: &WriteTransaction,
    image: &[u8],
    applied_index: u64,
) -> Result<i64, StoreError> {
    verify_stream(&mut &image[..], image.len() as u64)?;
    let records = read_header(image, &"the store image")?;
    replace(txn, records, applied_index)
}

/// Records `(index, term)` as the last snapshot installed, in the `raft` table.
fn record_installed(txn: &WriteTransaction, index: u64, term: u64) -> Result<(), StoreError> {
    let mut raft = txn.open_table(RAFT)?;
    raft.insert(RAFT_SNAPSHOT_INDEX, index.to_be_bytes().as_slice())?;
    raft.insert(RAFT_SNAPSHOT_TERM, term.to_be_bytes().as_slice())?;
    Ok(())
}

/// The table replacement of [`install`]: everything but the member's identity becomes what
/// the records `r` hold (a snapshot of an older version has no alarms: none are active), and
/// the applied index becomes `applied_index`. Returns the snapshot's revision.
fn replace<R: Read>(
    txn: &WriteTransaction,
    mut r: RecordReader<R>,
    applied_index: u64,
) -> Result<i64, StoreError> {
    let mut identity = Vec::new();
    {
        let meta = txn.open_table(META)?;
        for name in [META_FORMAT, META_CLUSTER_ID, META_MEMBER_ID] {
            if let Some(value) = meta.get(name)? {
                identity.push((name, value.value()));
            }
        }
    }
    clear(txn, META)?;
    clear(txn, KV)?;
    clear(txn, LEASES)?;
    clear(txn, MEMBERS)?;
    clear(txn, RAFT)?;
    clear(txn, ALARMS)?;
    let mut meta = txn.open_table(META)?;
    let mut kv = txn.open_table(KV)?;
    let mut leases = txn.open_table(LEASES)?;
    let mut members = txn.open_table(MEMBERS)?;
    let mut raft = txn.open_table(RAFT)?;
    let mut alarms = txn.open_table(ALARMS)?;
    for (name, value) in identity {
        meta.insert(name, value)?;
    }
    let mut revision = None;
    while let Some(record) = r.next()? {
        match record {
            Record::Meta { name, value } => {
                if name == META_FORMAT && value != mvcc::FORMAT_VERSION {
                    return Err(StoreError::DataDir(format!(
                        "snapshot holds store format {value}, not the format {} this skerry \
                         reads",
                        mvcc::FORMAT_VERSION
                    )));
                }
                if name == META_FORMAT || MEMBER_META.contains(&name.as_str()) {
                    continue;
                }
                if name == META_REVISION {
                    revision = Some(i64::try_from(value).map_err(|_| {
                        StoreError::DataDir(format!("snapshot revision {value} is out of range"))
                    })?);
                }
                meta.insert(name.as_str(), value)?;
            }
            Record::Kv { rev, row } => {
                kv.insert(rev, row.as_slice())?;
            }
            Record::Lease { id, ttl } => {
                leases.insert(id, ttl)?;
            }
            Record::Member { id, row } => {
                members.insert(id, row.as_slice())?;
            }
            Record::Raft { name, value } => {
                raft.insert(name.as_str(), value.as_slice())?;
            }
            Record::Alarm { kind, member } => {
                alarms.insert((kind, member), ())?;
            }
        }
    }
    let revision =
        revision.ok_or_else(|| StoreError::DataDir("snapshot records no revision".into()))?;
    meta.insert(META_APPLIED_INDEX, applied_index)?;
    Ok(revision)
}

/// Empties one table of `txn` (dropping its whole tree is cheaper than deleting row by row).
fn clear<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<(), StoreError> {
    txn.delete_table(table)?;
    txn.open_table(table)?;
    Ok(())
}

/// A quick check that a file is a complete skerry snapshot: magic and digest.
pub fn verify(snapshot: &Path) -> Result<(), StoreError> {
    let mut file = std::fs::File::open(snapshot)?;
    let len = file.metadata()?.len();
    verify_stream(&mut file, len)
}

/// [`verify`] over the `len` bytes `snapshot` yields.
fn verify_stream(snapshot: &mut impl Read, len: u64) -> Result<(), StoreError> {
    if len < BODY_ALIGN_BYTES + DIGEST_BYTES as u64 || len % BODY_ALIGN_BYTES != DIGEST_BYTES as u64
    {
        return Err(StoreError::DataDir(format!(
            "snapshot of {len} bytes is truncated or not a skerry snapshot"
        )));
    }
    let mut hasher = Sha256::new();
    let body = len - DIGEST_BYTES as u64;
    let mut reader = snapshot.by_ref().take(body);
    std::io::copy(&mut reader, &mut hasher)?;
    let mut digest = [0u8; DIGEST_BYTES];
    snapshot.read_exact(&mut digest)?;
    if hasher.finalize()[..] != digest[..] {
        return Err(StoreError::DataDir(
            "snapshot digest does not match its contents".into(),
        ));
    }
    Ok(())
}
