//! The atomic writer on a real file system: a reader never sees a partial or missing file
//! across 1,000 updates, modes are exact whatever the umask, names that leave the payload
//! are removed with the old data directory, an unchanged payload writes nothing, and bad
//! paths are refused before anything is touched.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use skerry_node::volume::atomic_writer::{
    AtomicWriter, FileProjection, Payload, RETIRE_GRACE, WriteError,
};

/// Updates the reader races against (the brief's figure).
const UPDATES: usize = 1_000;
/// Size of each version of the file: large enough that a write is many syscalls, so a
/// reader of a file being written in place would see it half done.
const VERSION_BYTES: usize = 64 * 1024;

fn file(data: impl Into<Vec<u8>>, mode: u32) -> FileProjection {
    FileProjection {
        data: data.into(),
        mode,
    }
}

fn payload(items: &[(&str, &[u8], u32)]) -> Payload {
    items
        .iter()
        .map(|(p, d, m)| (p.to_string(), file(d.to_vec(), *m)))
        .collect()
}

/// Version `i` of a file: a header naming `i`, then a body that depends on `i`, so a reader
/// can tell a whole version from a torn one.
fn version(i: usize) -> Vec<u8> {
    let mut out = format!("v{i:06}:").into_bytes();
    let fill = b'a' + (i % 26) as u8;
    out.resize(VERSION_BYTES, fill);
    out
}

fn is_whole_version(data: &[u8]) -> bool {
    let Some(header) = data.get(1..7) else {
        return false;
    };
    let Ok(i) = std::str::from_utf8(header).unwrap_or("x").parse::<usize>() else {
        return false;
    };
    data == version(i).as_slice()
}

fn data_dirs(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("..") && n != "..data")
        .collect();
    out.sort();
    out
}

#[test]
fn readers_never_see_a_partial_or_missing_file_across_a_thousand_updates() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = AtomicWriter::new(dir.path()).unwrap();
    let make = |i: usize| -> Payload {
        [
            ("key".to_string(), file(version(i), 0o644)),
            ("conf/nested/value".to_string(), file(version(i), 0o644)),
        ]
        .into()
    };
    assert!(writer.write(&make(0)).unwrap());

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = ["key", "conf/nested/value"]
        .into_iter()
        .map(|rel| {
            let path = dir.path().join(rel);
            let stop = stop.clone();
            let reads = reads.clone();
            std::thread::spawn(move || {
                let mut versions_seen = std::collections::BTreeSet::new();
                while !stop.load(Ordering::Relaxed) {
                    let data = match fs::read(&path) {
                        Ok(d) => d,
                        Err(e) => panic!("{} unreadable during an update: {e}", path.display()),
                    };
                    assert!(
                        is_whole_version(&data),
                        "{}: a torn read of {} bytes",
                        path.display(),
                        data.len()
                    );
                    versions_seen.insert(data[1..7].to_vec());
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                versions_seen.len()
            })
        })
        .collect();

    for i in 1..=UPDATES {
        assert!(
            writer.write(&make(i)).unwrap(),
            "version {i} changes the content"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        let seen = reader.join().expect("the reader saw every file whole");
        assert!(
            seen > 1,
            "the reader raced at least one swap (saw {seen} versions)"
        );
    }
    assert!(reads.load(Ordering::Relaxed) > 0);
    assert_eq!(fs::read(dir.path().join("key")).unwrap(), version(UPDATES));
    // Superseded directories stay for the grace period, then go.
    assert!(
        data_dirs(dir.path()).len() > 1,
        "recent old versions are kept"
    );
    std::thread::sleep(RETIRE_GRACE);
    writer.prune().unwrap();
    assert_eq!(
        data_dirs(dir.path()).len(),
        1,
        "old data directories are removed"
    );
    assert!(!dir.path().join("..data_tmp").exists());
}

#[test]
fn layout_is_links_through_data_to_a_timestamped_dir() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = AtomicWriter::new(dir.path()).unwrap();
    writer
        .write(&payload(&[("a", b"1", 0o644), ("d/e/f", b"2", 0o644)]))
        .unwrap();
    assert_eq!(
        fs::read_link(dir.path().join("a")).unwrap(),
        Path::new("..data/a")
    );
    assert_eq!(
        fs::read_link(dir.path().join("d")).unwrap(),
        Path::new("..data/d")
    );
    let ts = fs::read_link(dir.path().join("..data")).unwrap();
    let ts = ts.to_str().unwrap();
    // `..2006_01_02_15_04_05.<digits>`
    let rest = ts.strip_prefix("..").unwrap();
    let (stamp, random) = rest.split_once('.').unwrap();
    assert_eq!(stamp.len(), "2006_01_02_15_04_05".len(), "{ts}");
    assert!(
        stamp
            .split('_')
            .all(|p| p.chars().all(|c| c.is_ascii_digit())),
        "{ts}"
    );
    assert!(
        !random.is_empty() && random.chars().all(|c| c.is_ascii_digit()),
        "{ts}"
    );
    let mode = fs::metadata(dir.path().join(ts))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o755);
    assert_eq!(fs::read(dir.path().join("d/e/f")).unwrap(), b"2");
    assert!(
        fs::symlink_metadata(dir.path().join("..data/d/e/f"))
            .unwrap()
            .is_file()
    );
}

#[test]
fn modes_are_exact_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = AtomicWriter::new(dir.path()).unwrap();
    // The process umask (022 here) would narrow 0777 and 0666 if modes came from open(2).
    writer
        .write(&payload(&[
            ("open", b"x", 0o777),
            ("shared", b"y", 0o666),
            ("secret", b"z", 0o400),
            ("dir/item", b"w", 0o600),
        ]))
        .unwrap();
    for (name, want) in [
        ("open", 0o777),
        ("shared", 0o666),
        ("secret", 0o400),
        ("dir/item", 0o600),
    ] {
        let mode = fs::metadata(dir.path().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(mode, want, "{name}: {mode:o}");
    }
}

#[test]
fn names_that_leave_the_payload_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = AtomicWriter::new(dir.path()).unwrap();
    writer
        .write(&payload(&[
            ("keep", b"1", 0o644),
            ("gone", b"2", 0o644),
            ("dir/old", b"3", 0o644),
            ("olddir/x", b"4", 0o644),
        ]))
        .unwrap();
    let first = data_dirs(dir.path());
    writer
        .write(&payload(&[("keep", b"1", 0o644), ("dir/new", b"5", 0o644)]))
        .unwrap();
    assert_eq!(fs::read(dir.path().join("keep")).unwrap(), b"1");
    assert_eq!(fs::read(dir.path().join("dir/new")).unwrap(), b"5");
    for gone in ["gone", "dir/old", "olddir", "olddir/x"] {
        let err = fs::symlink_metadata(dir.path().join(gone)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound, "{gone} is removed");
    }
    assert_eq!(
        data_dirs(dir.path()).len(),
        2,
        "the old directory is retired, not yet removed"
    );
    std::thread::sleep(RETIRE_GRACE);
    writer.prune().unwrap();
    let second = data_dirs(dir.path());
    assert_eq!(second.len(), 1);
    assert_ne!(first, second, "the old data directory is gone");
    // Only the payload's names and the writer's own are in the volume.
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".."))
        .collect();
    names.sort();
    assert_eq!(names, ["dir", "keep"]);
}

#[test]
fn an_unchanged_payload_writes_nothing_but_restores_links() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = AtomicWriter::new(dir.path()).unwrap();
    let p = payload(&[("a", b"same", 0o644), ("b/c", b"same too", 0o644)]);
    assert!(writer.write(&p).unwrap());
    let ts = fs::read_link(dir.path().join("..data")).unwrap();
    assert!(!writer.write(&p).unwrap(), "nothing to write");
    assert_eq!(fs::read_link(dir.path().join("..data")).unwrap(), ts);
    // A user-visible link lost (kubernetes/kubernetes#121472) comes back without a rewrite.
    fs::remove_file(dir.path().join("a")).unwrap();
    assert!(!writer.write(&p).unwrap());
    assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"same");
    assert_eq!(fs::read_link(dir.path().join("..data")).unwrap(), ts);
    // A content change does write.
    assert!(
        writer
            .write(&payload(&[
                ("a", b"new", 0o644),
                ("b/c", b"same too", 0o644)
            ]))
            .unwrap()
    );
    assert_ne!(fs::read_link(dir.path().join("..data")).unwrap(), ts);
}

#[test]
fn bad_paths_are_refused_and_nothing_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = AtomicWriter::new(dir.path()).unwrap();
    writer.write(&payload(&[("ok", b"1", 0o644)])).unwrap();
    let before = fs::read_link(dir.path().join("..data")).unwrap();
    for (bad, want) in [
        (
            "../escape",
            "invalid path: must not contain '..': ../escape",
        ),
        (
            "a/../../b",
            "invalid path: must not contain '..': a/../../b",
        ),
        (
            "/etc/passwd",
            "invalid path: must be relative path: /etc/passwd",
        ),
        ("..data", "invalid path: must not start with '..': ..data"),
        (
            "..2024_01_01",
            "invalid path: must not start with '..': ..2024_01_01",
        ),
        ("", "invalid path: must not be empty: \"\""),
    ] {
        let p = payload(&[("ok", b"2", 0o644), (bad, b"x", 0o644)]);
        match writer.write(&p) {
            Err(WriteError::InvalidPath(message)) => assert_eq!(message, want),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(fs::read_link(dir.path().join("..data")).unwrap(), before);
    assert_eq!(fs::read(dir.path().join("ok")).unwrap(), b"1");
    assert!(!dir.path().parent().unwrap().join("escape").exists());
    assert!(AtomicWriter::new(dir.path().join("missing")).is_err());
}

#[test]
fn directories_of_an_earlier_writer_are_removed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = AtomicWriter::new(dir.path()).unwrap();
    first.write(&payload(&[("a", b"1", 0o644)])).unwrap();
    first.write(&payload(&[("a", b"2", 0o644)])).unwrap();
    assert_eq!(data_dirs(dir.path()).len(), 2);
    // A new process (a restarted kubelet) knows nothing of the retired one.
    let mut second = AtomicWriter::new(dir.path()).unwrap();
    second.write(&payload(&[("a", b"3", 0o644)])).unwrap();
    assert_eq!(
        data_dirs(dir.path()).len(),
        2,
        "the current one and the one just retired"
    );
    assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"3");
}

#[test]
fn a_stale_data_tmp_link_does_not_block_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = AtomicWriter::new(dir.path()).unwrap();
    writer.write(&payload(&[("a", b"1", 0o644)])).unwrap();
    // What a crash between the symlink and the rename leaves.
    std::os::unix::fs::symlink("..nowhere", dir.path().join("..data_tmp")).unwrap();
    assert!(writer.write(&payload(&[("a", b"2", 0o644)])).unwrap());
    assert_eq!(fs::read(dir.path().join("a")).unwrap(), b"2");
    assert!(fs::symlink_metadata(dir.path().join("..data_tmp")).is_err());
}
