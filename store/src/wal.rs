//! The write-ahead log: what makes a batch durable with one small fsync.
//!
//! A batch of commands is durable once its records are in the log and the log is
//! `fdatasync`ed; the redb transaction that applies the same batch commits without an fsync
//! (`Durability::None`) and is made durable only every so often (a *checkpoint*), as etcd does
//! with its WAL and bbolt. The fsync per batch then writes a few pages of one preallocated file
//! instead of every btree page the batch touched plus the file's metadata. The store measured
//! both designs; see the README and `benches/store.rs`.
//!
//! # Format
//! The log is a directory of segments named `{seq:016x}-{first_index:016x}.wal` (etcd's
//! naming). Each segment is preallocated with zeros (to [`WAL_SEGMENT_BYTES`] by default) by a background
//! thread, so appending never changes a file's size and `fdatasync` need not write an inode.
//! A segment starts with a 16-byte header (magic and first index); then records:
//!
//! ```text
//! u32 payload length | u32 crc32(index ‖ payload) | u64 index | payload
//! ```
//!
//! all little-endian. Indexes are consecutive across segments. Reading stops at the first
//! record whose length is zero or whose checksum fails: that is where the last write was torn
//! by a crash. Because that write was never acknowledged, recovery zeroes the rest of the
//! segment, so that records a later, shorter write leaves behind can never be read as new.
//!
//! # Lifecycle
//! [`Wal::open`] returns the records after the store's applied index for replay;
//! [`Wal::append`] writes and syncs one batch; [`Wal::release`] deletes the segments whose
//! every record is in a durable redb commit.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use bytes::Bytes;
use tracing::{info, warn};

use crate::error::StoreError;

/// Bytes each segment is preallocated to: etcd's `SegmentSizeBytes`. At ~300 bytes per put
/// record a segment holds about 200,000 writes, so rotation (a rename and a directory fsync)
/// is rare, and the zero-fill of the next one, done in the background, is cheap beside it.
pub const WAL_SEGMENT_BYTES: u64 = 64 << 20;

/// Smallest segment size accepted: a segment must hold at least a handful of records, and a
/// tiny one would rotate (a rename and a directory fsync) on nearly every batch.
pub const WAL_SEGMENT_BYTES_MIN: u64 = 64 << 10;

/// The segment header: magic, then the first index as u64.
const SEGMENT_MAGIC: &[u8; 8] = b"skrywal1";
const SEGMENT_HEADER_BYTES: u64 = 16;
/// Length, checksum and index in front of each payload.
const RECORD_HEADER_BYTES: usize = 16;
/// Largest payload a record may claim. A command is at most the gRPC request limit (2 MiB
/// with overhead); anything far larger is a torn or foreign length, not a record.
const RECORD_PAYLOAD_MAX: usize = 64 << 20;
/// Chunk in which recovery reads and zeroes a torn tail.
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// Name of the preallocated spare segment while it is being prepared.
const SPARE_NAME: &str = "spare.tmp";

/// One segment on disk.
#[derive(Debug, Clone)]
struct Segment {
    seq: u64,
    first_index: u64,
    path: PathBuf,
}

/// The log, positioned for appending.
pub struct Wal {
    dir: PathBuf,
    /// Size new segments are preallocated to.
    segment_bytes: u64,
    /// Every segment on disk, oldest first; the last one is open for appending.
    segments: Vec<Segment>,
    /// The open segment.
    file: File,
    /// Where the next record goes in the open segment.
    offset: u64,
    /// Size of the open segment (its preallocated length, or more after an oversize batch).
    capacity: u64,
    /// Index of the last record written (or of the last applied command on a fresh log).
    last_index: u64,
    /// The spare segment being preallocated in the background; started once the open segment
    /// is half full, so a store that never fills one never pays for two.
    spare: Option<JoinHandle<Result<File, StoreError>>>,
    buf: Vec<u8>,
    /// Test-only fault injection: a stall added to every sync (see [`SyncFault`]).
    sync_fault: Option<SyncFault>,
}

/// A fault hook for tests: called after each `fdatasync`, returns how much longer the sync
/// is to take (a slow SD card's stall); counted in the sync's measured time, so the slow-sync
/// alarm sees it as it would see a slow disk. Only tests and the simulation set one; nothing
/// in a running server does.
pub type SyncFault = std::sync::Arc<dyn Fn() -> std::time::Duration + Send + Sync>;

impl Wal {
    /// Opens the log in `dir` (creating it), returns it with every record whose index is after
    /// `applied` (in order, consecutive from `applied + 1`), and positions it after the last
    /// valid record. New segments are preallocated to `segment_bytes`.
    pub fn open(
        dir: &Path,
        applied: u64,
        segment_bytes: u64,
    ) -> Result<(Wal, Vec<(u64, Bytes)>), StoreError> {
        if segment_bytes < WAL_SEGMENT_BYTES_MIN {
            return Err(StoreError::Storage(format!(
                "write-ahead log segments must be at least {WAL_SEGMENT_BYTES_MIN} bytes"
            )));
        }
        fs::create_dir_all(dir)?;
        let _ = fs::remove_file(dir.join(SPARE_NAME));
        let mut segments = list_segments(dir)?;
        // Segments wholly at or below `applied` are in redb already: drop them.
        while segments.len() > 1 && segments[1].first_index <= applied + 1 {
            let old = segments.remove(0);
            fs::remove_file(&old.path)?;
        }
        let mut records = Vec::new();
        let mut last_index = None;
        let mut tail = None;
        let count = segments.len();
        for (i, segment) in segments.iter().enumerate() {
            let data = fs::read(&segment.path)?;
            let (end, seg_last) = read_segment(segment, &data, applied, last_index, &mut records)?;
            if i + 1 < count && end < data.len() as u64 && !is_zero(&data[end as usize..]) {
                return Err(corrupt(
                    segment,
                    end,
                    "a damaged record before the last segment",
                ));
            }
            if seg_last.is_some() {
                last_index = seg_last;
            }
            if i + 1 == count {
                tail = Some((end, data.len() as u64, data));
            }
        }
        // What the log ends at: its last record, or just before its first segment when it has
        // no records.
        let wal_last = last_index.or_else(|| segments.first().map(|s| s.first_index - 1));
        if let Some(wal_last) = wal_last
            && wal_last > applied
            && records.first().map(|(i, _)| *i) != Some(applied + 1)
        {
            return Err(StoreError::DataDir(format!(
                "write-ahead log {} does not hold the commands after {applied}, the last one \
                 the store applied: commands are missing",
                dir.display()
            )));
        }
        let wal = match (segments.last().cloned(), tail) {
            (Some(segment), Some((end, len, data))) if wal_last.unwrap_or(0) >= applied => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&segment.path)?;
                zero_from(&file, &data, end)?;
                drop(data);
                Wal {
                    dir: dir.to_path_buf(),
                    segment_bytes,
                    segments,
                    file,
                    offset: end,
                    capacity: len,
                    last_index: wal_last.unwrap_or(applied),
                    spare: None,
                    buf: Vec::new(),
                    sync_fault: None,
                }
            }
            (last, _) => {
                // A fresh log, or one that ends before what redb holds (redb was committed
                // after a log write failed): start a new segment after the applied index.
                if last.is_some() {
                    warn!(
                        applied,
                        "write-ahead log ends before the applied index; starting a new segment"
                    );
                }
                let seq = last.map_or(0, |s| s.seq + 1);
                let spare = prepare_spare(dir, segment_bytes)?;
                let segment = install_segment(dir, spare, seq, applied + 1)?;
                let file = segment.1;
                segments.push(segment.0);
                Wal {
                    dir: dir.to_path_buf(),
                    segment_bytes,
                    segments,
                    file,
                    offset: SEGMENT_HEADER_BYTES,
                    capacity: segment_bytes,
                    last_index: applied,
                    spare: None,
                    buf: Vec::new(),
                    sync_fault: None,
                }
            }
        };
        info!(
            segments = wal.segments.len(),
            replay = records.len(),
            last_index = wal.last_index,
            "opened write-ahead log"
        );
        Ok((wal, records))
    }

    /// The index of the last record in the log.
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// Appends records with consecutive indexes following [`Wal::last_index`] and makes them
    /// durable (one `fdatasync`).
    pub fn append<'a>(
        &mut self,
        records: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> Result<(), StoreError> {
        self.write(records)?;
        self.sync()
    }

    /// Makes every record written so far durable (one `fdatasync`, timed for
    /// `etcd_disk_wal_fsync_duration_seconds` and the slow-disk alarm).
    pub fn sync(&mut self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        self.file.sync_data()?;
        if let Some(fault) = &self.sync_fault {
            std::thread::sleep(fault());
        }
        crate::metrics::observe_wal_fsync(started.elapsed());
        Ok(())
    }

    /// Installs a test's sync fault (see [`SyncFault`]); `None` removes it.
    pub fn set_sync_fault(&mut self, fault: Option<SyncFault>) {
        self.sync_fault = fault;
    }

    /// Like [`Wal::append`] without the final sync: the records become durable with the next
    /// synced append (a full segment is synced before the log moves on).
    pub fn append_unsynced<'a>(
        &mut self,
        records: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> Result<(), StoreError> {
        self.write(records)
    }

    /// The index of the first record held on disk in `dir` (from the oldest segment's name),
    /// or `None` when there is no log there yet. A log whose front was released opens with
    /// `applied` one below this.
    pub fn first_index_on_disk(dir: &Path) -> Result<Option<u64>, StoreError> {
        if !dir.exists() {
            return Ok(None);
        }
        Ok(list_segments(dir)?.first().map(|s| s.first_index))
    }

    /// Writes records with consecutive indexes following [`Wal::last_index`] without syncing
    /// the open segment (a full segment is synced before the log moves on).
    fn write<'a>(
        &mut self,
        records: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> Result<(), StoreError> {
        self.buf.clear();
        let mut last = self.last_index;
        for (index, payload) in records {
            if index != last + 1 {
                return Err(StoreError::Storage(format!(
                    "write-ahead log append out of order: {index} after {last}"
                )));
            }
            let len = u32::try_from(payload.len())
                .ok()
                .filter(|l| *l as usize <= RECORD_PAYLOAD_MAX)
                .ok_or_else(|| StoreError::Storage("command too large for the log".into()))?;
            let mut crc = crc32fast::Hasher::new();
            crc.update(&index.to_le_bytes());
            crc.update(payload);
            self.buf.extend_from_slice(&len.to_le_bytes());
            self.buf.extend_from_slice(&crc.finalize().to_le_bytes());
            self.buf.extend_from_slice(&index.to_le_bytes());
            self.buf.extend_from_slice(payload);
            last = index;
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        let first = self.last_index + 1;
        if self.offset + self.buf.len() as u64 > self.capacity && self.offset > SEGMENT_HEADER_BYTES
        {
            self.rotate(first)?;
        }
        self.file.write_all_at(&self.buf, self.offset)?;
        // One batch larger than a segment grows the file; `fdatasync` syncs the new size too.
        let end = self.offset + self.buf.len() as u64;
        self.capacity = self.capacity.max(end);
        self.offset = end;
        self.last_index = last;
        if self.spare.is_none() && self.offset > self.capacity / 2 {
            self.start_spare();
        }
        Ok(())
    }

    /// Deletes every segment whose records are all at or below `durable`, the applied index
    /// of the last durable redb commit. The open segment is kept.
    pub fn release(&mut self, durable: u64) -> Result<(), StoreError> {
        let mut removed = false;
        while self.segments.len() > 1 && self.segments[1].first_index <= durable + 1 {
            let old = self.segments.remove(0);
            fs::remove_file(&old.path)?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Number of segment files, for tests and status.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Closes the full segment and continues in the spare one, whose first record is `first`.
    /// The full segment is synced first, so that syncing the new one makes everything
    /// written before durable too.
    fn rotate(&mut self, first: u64) -> Result<(), StoreError> {
        self.file.sync_data()?;
        let spare = match self.spare.take() {
            Some(handle) => handle.join().map_err(|_| {
                StoreError::Storage("write-ahead log preallocation panicked".into())
            })?,
            None => prepare_spare(&self.dir, self.segment_bytes),
        };
        let spare = match spare {
            Ok(file) => file,
            // A failed background preallocation (say, a full disk a moment ago) is retried
            // here once before the write fails.
            Err(_) => prepare_spare(&self.dir, self.segment_bytes)?,
        };
        let seq = self.segments.last().map_or(0, |s| s.seq + 1);
        let (segment, file) = install_segment(&self.dir, spare, seq, first)?;
        self.segments.push(segment);
        self.file = file;
        self.offset = SEGMENT_HEADER_BYTES;
        self.capacity = self.segment_bytes;
        Ok(())
    }

    fn start_spare(&mut self) {
        let dir = self.dir.clone();
        let bytes = self.segment_bytes;
        self.spare = std::thread::Builder::new()
            .name("skerry-wal-alloc".into())
            .spawn(move || prepare_spare(&dir, bytes))
            .ok();
    }
}

fn corrupt(segment: &Segment, offset: u64, what: &str) -> StoreError {
    StoreError::DataDir(format!(
        "write-ahead log segment {} is corrupt at byte {offset}: {what}",
        segment.path.display()
    ))
}

/// The segments in `dir`, by sequence number; anything else in the directory is refused.
fn list_segments(dir: &Path) -> Result<Vec<Segment>, StoreError> {
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == SPARE_NAME {
            // A preallocation a crash interrupted: holds no records (`open` removes it).
            continue;
        }
        let parsed = name
            .strip_suffix(".wal")
            .and_then(|stem| stem.split_once('-'))
            .and_then(|(seq, first)| {
                Some((
                    u64::from_str_radix(seq, 16).ok()?,
                    u64::from_str_radix(first, 16).ok()?,
                ))
            });
        let Some((seq, first_index)) = parsed else {
            return Err(StoreError::DataDir(format!(
                "write-ahead log {} holds {name}, which is not a log segment",
                dir.display()
            )));
        };
        segments.push(Segment {
            seq,
            first_index,
            path: entry.path(),
        });
    }
    segments.sort_by_key(|s| s.seq);
    for pair in segments.windows(2) {
        if pair[1].seq != pair[0].seq + 1 || pair[1].first_index <= pair[0].first_index {
            return Err(StoreError::DataDir(format!(
                "write-ahead log {}: segments {} and {} do not follow each other",
                dir.display(),
                pair[0].path.display(),
                pair[1].path.display()
            )));
        }
    }
    Ok(segments)
}

/// Reads the records of one segment, keeping those after `applied`. Returns the offset after
/// the last valid record and the last record's index. `prev` is the index before this
/// segment's first record, when known, to check that indexes are consecutive.
fn read_segment(
    segment: &Segment,
    data: &[u8],
    applied: u64,
    prev: Option<u64>,
    out: &mut Vec<(u64, Bytes)>,
) -> Result<(u64, Option<u64>), StoreError> {
    if data.len() < SEGMENT_HEADER_BYTES as usize || &data[..8] != SEGMENT_MAGIC {
        return Err(corrupt(segment, 0, "not a skerry log segment"));
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&data[8..16]);
    if u64::from_le_bytes(word) != segment.first_index {
        return Err(corrupt(segment, 8, "its header names another first index"));
    }
    if let Some(prev) = prev
        && prev + 1 != segment.first_index
    {
        return Err(corrupt(
            segment,
            8,
            "its first index does not follow the last segment",
        ));
    }
    let mut offset = SEGMENT_HEADER_BYTES as usize;
    let mut expected = segment.first_index;
    let mut last = None;
    while offset + RECORD_HEADER_BYTES <= data.len() {
        let header = &data[offset..offset + RECORD_HEADER_BYTES];
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        word.copy_from_slice(&header[8..16]);
        let index = u64::from_le_bytes(word);
        let body = offset + RECORD_HEADER_BYTES;
        if len == 0 || len > RECORD_PAYLOAD_MAX || body + len > data.len() || index != expected {
            break;
        }
        let payload = &data[body..body + len];
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&index.to_le_bytes());
        hasher.update(payload);
        if hasher.finalize() != crc {
            break;
        }
        if index > applied {
            out.push((index, Bytes::copy_from_slice(payload)));
        }
        last = Some(index);
        expected += 1;
        offset = body + len;
    }
    Ok((offset as u64, last))
}

fn is_zero(data: &[u8]) -> bool {
    data.iter().all(|b| *b == 0)
}

/// Zeroes `file` from `from` to its end wherever `data` (its contents) is not zero already,
/// then syncs: a torn tail is gone before anything new is written after it.
fn zero_from(file: &File, data: &[u8], from: u64) -> Result<(), StoreError> {
    let zeros = vec![0u8; ZERO_CHUNK_BYTES];
    let mut dirty = false;
    let mut at = from as usize;
    while at < data.len() {
        let end = (at + ZERO_CHUNK_BYTES).min(data.len());
        if !is_zero(&data[at..end]) {
            file.write_all_at(&zeros[..end - at], at as u64)?;
            dirty = true;
        }
        at = end;
    }
    if dirty {
        warn!(offset = from, "zeroed the torn tail of the write-ahead log");
        file.sync_data()?;
    }
    Ok(())
}

/// Creates the spare segment: a file of `bytes` zeros, synced. Writing the
/// zeros (rather than `set_len`, which leaves a sparse file) allocates every block now, so
/// later appends overwrite allocated blocks and `fdatasync` has no metadata to write.
fn prepare_spare(dir: &Path, bytes: u64) -> Result<File, StoreError> {
    let path = dir.join(SPARE_NAME);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    let zeros = vec![0u8; ZERO_CHUNK_BYTES];
    let mut written = 0u64;
    while written < bytes {
        let n = (bytes - written).min(ZERO_CHUNK_BYTES as u64) as usize;
        file.write_all(&zeros[..n])?;
        written += n as u64;
    }
    file.sync_all()?;
    Ok(file)
}

/// Writes the header into the spare file, renames it to the segment's name and syncs the
/// directory, so the segment exists after a crash before any record in it is acknowledged.
fn install_segment(
    dir: &Path,
    file: File,
    seq: u64,
    first_index: u64,
) -> Result<(Segment, File), StoreError> {
    let mut header = [0u8; SEGMENT_HEADER_BYTES as usize];
    header[..8].copy_from_slice(SEGMENT_MAGIC);
    header[8..].copy_from_slice(&first_index.to_le_bytes());
    file.write_all_at(&header, 0)?;
    file.sync_data()?;
    let path = dir.join(format!("{seq:016x}-{first_index:016x}.wal"));
    fs::rename(dir.join(SPARE_NAME), &path)?;
    sync_dir(dir)?;
    Ok((
        Segment {
            seq,
            first_index,
            path,
        },
        file,
    ))
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small segments keep the tests quick and make them rotate.
    const SEG: u64 = 4 << 20;

    fn payload(i: u64) -> Vec<u8> {
        format!("command-{i}")
            .repeat((i % 7 + 1) as usize)
            .into_bytes()
    }

    fn append_range(wal: &mut Wal, from: u64, to: u64) {
        let payloads: Vec<(u64, Vec<u8>)> = (from..=to).map(|i| (i, payload(i))).collect();
        wal.append(payloads.iter().map(|(i, p)| (*i, p.as_slice())))
            .expect("append");
    }

    #[test]
    fn records_after_the_applied_index_come_back_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, replay) = Wal::open(dir.path(), 0, SEG).expect("open");
        assert!(replay.is_empty());
        append_range(&mut wal, 1, 10);
        append_range(&mut wal, 11, 12);
        drop(wal);
        let (wal, replay) = Wal::open(dir.path(), 4, SEG).expect("reopen");
        let indexes: Vec<u64> = replay.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, (5..=12).collect::<Vec<_>>());
        for (i, p) in &replay {
            assert_eq!(p.as_ref(), payload(*i).as_slice());
        }
        assert_eq!(wal.last_index(), 12);
    }

    #[test]
    fn out_of_order_appends_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = Wal::open(dir.path(), 0, SEG).expect("open");
        append_range(&mut wal, 1, 3);
        assert!(wal.append([(5u64, &b"x"[..])]).is_err());
        assert!(wal.append([(3u64, &b"x"[..])]).is_err());
        assert_eq!(wal.last_index(), 3);
    }

    #[test]
    fn a_torn_tail_is_cut_and_zeroed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = Wal::open(dir.path(), 0, SEG).expect("open");
        append_range(&mut wal, 1, 5);
        let good_end = wal.offset;
        append_range(&mut wal, 6, 9);
        let path = wal.segments[0].path.clone();
        drop(wal);
        // Tear record 6 (flip a payload byte): records 7-9 after it are intact but must not
        // come back, and must not come back after a shorter write either.
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        file.write_all_at(&[0xff], good_end + RECORD_HEADER_BYTES as u64)
            .expect("tear");
        drop(file);
        let (mut wal, replay) = Wal::open(dir.path(), 0, SEG).expect("reopen");
        assert_eq!(replay.len(), 5);
        assert_eq!(wal.last_index(), 5);
        assert!(is_zero(
            &fs::read(&path).expect("read")[good_end as usize..]
        ));
        wal.append([(6u64, &b"short"[..])]).expect("append");
        drop(wal);
        let (_, replay) = Wal::open(dir.path(), 0, SEG).expect("reopen");
        assert_eq!(replay.len(), 6);
        assert_eq!(replay[5].1.as_ref(), b"short");
    }

    #[test]
    fn segments_rotate_and_are_released_once_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = Wal::open(dir.path(), 0, SEG).expect("open");
        // Records of 64 KiB: about 64 fill a segment.
        let big = vec![7u8; 64 << 10];
        for i in 1..=150u64 {
            wal.append([(i, big.as_slice())]).expect("append");
        }
        assert_eq!(wal.segment_count(), 3);
        drop(wal);
        let (mut wal, replay) = Wal::open(dir.path(), 0, SEG).expect("reopen");
        assert_eq!(replay.len(), 150);
        assert_eq!(wal.segment_count(), 3);
        wal.release(100).expect("release");
        assert_eq!(wal.segment_count(), 2);
        wal.release(150).expect("release");
        assert_eq!(wal.segment_count(), 1);
        drop(wal);
        let (_, replay) = Wal::open(dir.path(), 150, SEG).expect("reopen");
        assert!(replay.is_empty());
    }

    #[test]
    fn a_batch_larger_than_a_segment_is_written_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = Wal::open(dir.path(), 0, SEG).expect("open");
        let chunk = vec![1u8; 2 << 20];
        let records: Vec<(u64, &[u8])> = (1..=5u64).map(|i| (i, chunk.as_slice())).collect();
        wal.append(records).expect("append");
        drop(wal);
        let (wal, replay) = Wal::open(dir.path(), 0, SEG).expect("reopen");
        assert_eq!(replay.len(), 5);
        assert_eq!(wal.last_index(), 5);
    }

    #[test]
    fn a_log_behind_the_store_starts_a_new_segment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = Wal::open(dir.path(), 0, SEG).expect("open");
        append_range(&mut wal, 1, 3);
        drop(wal);
        let (mut wal, replay) = Wal::open(dir.path(), 7, SEG).expect("reopen");
        assert!(replay.is_empty());
        assert_eq!(wal.last_index(), 7);
        append_range(&mut wal, 8, 9);
        drop(wal);
        let (_, replay) = Wal::open(dir.path(), 7, SEG).expect("reopen");
        assert_eq!(replay.len(), 2);
    }

    #[test]
    fn missing_commands_and_foreign_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = Wal::open(dir.path(), 0, SEG).expect("open");
        append_range(&mut wal, 1, 3);
        drop(wal);
        // The store would have applied nothing, but the log starts at 1: fine. A store at
        // index 0 with a log that starts at 5 is missing commands.
        let other = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = Wal::open(other.path(), 4, SEG).expect("open");
        append_range(&mut wal, 5, 6);
        drop(wal);
        assert!(matches!(
            Wal::open(other.path(), 0, SEG),
            Err(StoreError::DataDir(_))
        ));
        fs::write(dir.path().join("notes.txt"), b"hello").expect("write");
        assert!(matches!(
            Wal::open(dir.path(), 0, SEG),
            Err(StoreError::DataDir(_))
        ));
    }

    /// A kill -9 while the next segment was being preallocated leaves `spare.tmp` behind:
    /// the log still opens, also through `first_index_on_disk` (the Raft log's way in),
    /// which refused it as a foreign file and kept a killed member from starting again.
    #[test]
    fn an_interrupted_preallocation_does_not_stop_the_log_from_opening() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = Wal::open(dir.path(), 0, SEG).expect("open");
        append_range(&mut wal, 1, 3);
        drop(wal);
        fs::write(dir.path().join(SPARE_NAME), vec![0u8; 4096]).expect("write spare");
        assert_eq!(
            Wal::first_index_on_disk(dir.path()).expect("first index"),
            Some(1)
        );
        let (wal, replay) = Wal::open(dir.path(), 0, SEG).expect("reopen");
        assert_eq!(replay.len(), 3);
        assert_eq!(wal.last_index(), 3);
        assert!(!dir.path().join(SPARE_NAME).exists());
    }
}
