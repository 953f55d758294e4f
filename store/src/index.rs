//! The in-memory key index: for every key, the revisions at which it was put or deleted.
//!
//! This is etcd's `treeIndex` with the generations flattened: a key's history is one sorted
//! vector of `(revision, tombstone)` entries. The rows themselves (values, create revision,
//! version, lease) live in redb, keyed by revision; the index only answers "which row of this
//! key is visible at revision R". It is rebuilt from the rows when the store opens.
//!
//! Invariants: each key's entries are strictly increasing by revision; readers at a revision R
//! ignore entries above R, so the writer may append entries for a revision before it is
//! committed and published.

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

use crate::rev::Rev;

/// One change of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub rev: Rev,
    pub tombstone: bool,
}

/// Every key's history, in key order.
#[derive(Default, Debug)]
pub struct KeyIndex {
    keys: BTreeMap<Bytes, Vec<Entry>>,
}

/// A key range in etcd's conventions, already decoded from `(key, range_end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRange {
    /// `range_end` empty: exactly one key.
    Single(Bytes),
    /// `[start, end)`; `end = None` means every key `>= start` (etcd's `range_end = "\0"`).
    Span { start: Bytes, end: Option<Bytes> },
}

impl KeyRange {
    /// Decodes etcd's `(key, range_end)` pair.
    pub fn new(key: &Bytes, range_end: &Bytes) -> Self {
        if range_end.is_empty() {
            KeyRange::Single(key.clone())
        } else if range_end.as_ref() == [0] {
            KeyRange::Span {
                start: key.clone(),
                end: None,
            }
        } else {
            KeyRange::Span {
                start: key.clone(),
                end: Some(range_end.clone()),
            }
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Single(k) => k.as_ref() == key,
            KeyRange::Span { start, end } => {
                key >= start.as_ref() && end.as_ref().is_none_or(|e| key < e.as_ref())
            }
        }
    }
}

impl KeyIndex {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Keys whose latest change is not a delete: the keys a read at the current revision
    /// sees. Walks every key.
    pub fn live_len(&self) -> usize {
        self.keys
            .values()
            .filter(|entries| entries.last().is_some_and(|e| !e.tombstone))
            .count()
    }

    /// Records a put of `key` at `rev`.
    ///
    /// # Panics
    /// If `rev` is not above the key's last entry: the writer assigns revisions in order.
    pub fn put(&mut self, key: &Bytes, rev: Rev) {
        self.push(
            key,
            Entry {
                rev,
                tombstone: false,
            },
        );
    }

    /// Records a delete of `key` at `rev`.
    pub fn tombstone(&mut self, key: &Bytes, rev: Rev) {
        self.push(
            key,
            Entry {
                rev,
                tombstone: true,
            },
        );
    }

    fn push(&mut self, key: &Bytes, entry: Entry) {
        let entries = match self.keys.get_mut(key.as_ref()) {
            Some(entries) => entries,
            // A copy, not `key.clone()`: a key decoded from a request is a slice of that
            // request's whole receive buffer (tonic reads into 8 KiB), and the index keeps it
            // for the key's life. Cloning pinned ~5 KiB per key: 100,000 puts of 256-byte
            // values grew the server to 520 MB, and every new buffer was a fresh page fault.
            None => self.keys.entry(Bytes::copy_from_slice(key)).or_default(),
        };
        if let Some(last) = entries.last() {
            assert!(
                last.rev < entry.rev,
                "index entry {:?} after {:?}",
                entry.rev,
                last.rev
            );
        }
        entries.push(entry);
    }

    /// The revision of `key`'s row visible at `at`, if the key exists then.
    pub fn get(&self, key: &[u8], at: i64) -> Option<Rev> {
        self.keys.get(key).and_then(|entries| visible(entries, at))
    }

    /// Visits the keys of `range` that exist at `at`, in key order, with their visible row.
    /// The visitor returns `false` to stop.
    pub fn visit(&self, range: &KeyRange, at: i64, mut visitor: impl FnMut(&Bytes, Rev) -> bool) {
        match range {
            KeyRange::Single(key) => {
                if let Some((k, entries)) = self.keys.get_key_value(key.as_ref())
                    && let Some(rev) = visible(entries, at)
                {
                    visitor(k, rev);
                }
            }
            KeyRange::Span { start, end } => {
                if end.as_ref().is_some_and(|e| e <= start) {
                    return;
                }
                let upper = match end {
                    Some(e) => Bound::Excluded(e.as_ref()),
                    None => Bound::Unbounded,
                };
                let lower = Bound::Included(start.as_ref());
                for (k, entries) in self.keys.range::<[u8], _>((lower, upper)) {
                    if let Some(rev) = visible(entries, at)
                        && !visitor(k, rev)
                    {
                        return;
                    }
                }
            }
        }
    }

    /// Every key with an entry, in order from `after` (exclusive), at most `limit` of them: the
    /// compactor walks the index in bounded batches.
    pub fn keys_after(&self, after: Option<&Bytes>, limit: usize) -> Vec<Bytes> {
        let lower = match after {
            Some(k) => Bound::Excluded(k.as_ref()),
            None => Bound::Unbounded,
        };
        self.keys
            .range::<[u8], _>((lower, Bound::Unbounded))
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Drops `key`'s history below `at`. Every change at or above `at` stays (a watch from
    /// the compacted revision, which stays readable, sees all of them), and so does the last
    /// change below `at` if it is a put that a read at `at` sees. Returns the
    /// revisions whose rows can be deleted.
    ///
    /// etcd drops more: a key's whole generation when its tombstone is at or below `at`, even
    /// changes made exactly at `at`, so a watch from `at` can miss them. skerry keeps them.
    pub fn compact_key(&mut self, key: &[u8], at: i64, removed: &mut Vec<Rev>) {
        let Some(entries) = self.keys.get_mut(key) else {
            return;
        };
        let below = entries.partition_point(|e| e.rev.main < at);
        if below == 0 {
            return;
        }
        // The last change below `at` is what a read at `at` sees, unless it is a tombstone or
        // a change at exactly `at` hides it.
        let shadowed = entries.get(below).is_some_and(|e| e.rev.main == at);
        let drop_to = if entries[below - 1].tombstone || shadowed {
            below
        } else {
            below - 1
        };
        removed.extend(entries.drain(..drop_to).map(|e| e.rev));
        if entries.is_empty() {
            self.keys.remove(key);
        }
    }

    /// The whole history of one key (tests and invariant checks).
    pub fn entries(&self, key: &[u8]) -> Option<&[Entry]> {
        self.keys.get(key).map(Vec::as_slice)
    }
}

fn visible(entries: &[Entry], at: i64) -> Option<Rev> {
    let position = entries.partition_point(|e| e.rev.main <= at);
    let entry = entries.get(position.checked_sub(1)?)?;
    (!entry.tombstone).then_some(entry.rev)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// Whether `inner` points into `outer`'s memory.
    pub(crate) fn shares_memory(outer: &Bytes, inner: &Bytes) -> bool {
        outer.as_ptr_range().contains(&inner.as_ptr())
    }

    #[test]
    fn a_new_key_is_copied_out_of_the_request_buffer() {
        // As prost decodes a request: the key is a slice of the whole receive buffer.
        let mut buffer = vec![0u8; 8192];
        buffer[..3].copy_from_slice(b"key");
        let buffer = Bytes::from(buffer);
        let key = buffer.slice(0..3);
        let mut index = KeyIndex::default();
        index.put(&key, Rev::new(2, 0));
        index.put(&key, Rev::new(3, 0));
        let (stored, _) = index.keys.first_key_value().expect("one key");
        assert_eq!(stored.as_ref(), b"key");
        assert!(
            !shares_memory(&buffer, stored),
            "the index pins the 8 KiB request buffer"
        );
        assert_eq!(index.get(b"key", 3), Some(Rev::new(3, 0)));
    }

    #[test]
    fn visible_revision_follows_puts_and_deletes() {
        let mut index = KeyIndex::default();
        index.put(&b("a"), Rev::new(2, 0));
        index.put(&b("a"), Rev::new(4, 0));
        index.tombstone(&b("a"), Rev::new(6, 0));
        index.put(&b("a"), Rev::new(8, 1));
        assert_eq!(index.get(b"a", 1), None);
        assert_eq!(index.get(b"a", 3), Some(Rev::new(2, 0)));
        assert_eq!(index.get(b"a", 5), Some(Rev::new(4, 0)));
        assert_eq!(index.get(b"a", 6), None);
        assert_eq!(index.get(b"a", 7), None);
        assert_eq!(index.get(b"a", 8), Some(Rev::new(8, 1)));
    }

    #[test]
    fn compaction_keeps_the_visible_row_and_drops_old_tombstones() {
        let mut index = KeyIndex::default();
        index.put(&b("a"), Rev::new(2, 0));
        index.put(&b("a"), Rev::new(4, 0));
        index.put(&b("a"), Rev::new(9, 0));
        index.put(&b("d"), Rev::new(3, 0));
        index.tombstone(&b("d"), Rev::new(5, 0));
        index.put(&b("t"), Rev::new(3, 1));
        index.tombstone(&b("t"), Rev::new(7, 0));
        let mut removed = vec![];
        for key in ["a", "d", "t"] {
            index.compact_key(key.as_bytes(), 7, &mut removed);
        }
        removed.sort();
        assert_eq!(
            removed,
            vec![
                Rev::new(2, 0),
                Rev::new(3, 0),
                Rev::new(3, 1),
                Rev::new(5, 0)
            ]
        );
        assert_eq!(index.get(b"a", 7), Some(Rev::new(4, 0)));
        assert!(
            index.entries(b"d").is_none(),
            "a key deleted before the compaction is gone"
        );
        assert_eq!(
            index.entries(b"t").map(<[Entry]>::len),
            Some(1),
            "tombstone at `at` kept"
        );
    }

    #[test]
    fn compaction_keeps_every_change_at_the_compaction_revision() {
        let mut index = KeyIndex::default();
        index.put(&b("a"), Rev::new(1, 0));
        index.put(&b("a"), Rev::new(2, 0));
        index.tombstone(&b("a"), Rev::new(2, 2));
        let mut removed = vec![];
        index.compact_key(b"a", 2, &mut removed);
        assert_eq!(removed, vec![Rev::new(1, 0)], "hidden by the changes at 2");
        assert_eq!(index.entries(b"a").map(<[Entry]>::len), Some(2));
    }

    #[test]
    fn ranges_follow_etcd_conventions() {
        let all = KeyRange::new(&b("a"), &Bytes::from_static(&[0]));
        assert!(all.contains(b"zzz"));
        assert!(!all.contains(b"0"));
        let prefix = KeyRange::new(&b("foo"), &b("fop"));
        assert!(prefix.contains(b"foo/bar"));
        assert!(!prefix.contains(b"fop"));
        let single = KeyRange::new(&b("k"), &Bytes::new());
        assert!(single.contains(b"k") && !single.contains(b"k0"));
    }
}
