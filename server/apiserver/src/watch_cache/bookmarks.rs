//! Time buckets of watchers: who gets a bookmark, or reaches its deadline, in which second.
//!
//! This carries `docs/tricks.md` #6, bookmarks bucketed per second: there is no timer per
//! watcher. A watcher is filed under the whole second at which its next bookmark is due, and
//! one ticker pops every due bucket in bulk once a second. The same structure files watch
//! deadlines (`timeoutSeconds`), so a watch needs no timer of its own at all.
//!
//! Entries are never removed early: a watcher that went away, or was re-filed, leaves a stale
//! entry that the popper skips (the cache checks the watcher still exists and is still due
//! at that second). That keeps filing O(log buckets) and removal free.

use std::collections::BTreeMap;
use std::time::Duration;

/// How often a live watcher that allows bookmarks hears one. Kubernetes' cacher sends them
/// "roughly every minute" (`bookmarkFrequency = time.Minute`); more often costs a frame per
/// watcher per period for nothing, less often lets a quiet watcher's resume point age toward
/// the compaction horizon (5 minutes in Kubernetes), after which a re-watch gets 410.
pub const BOOKMARK_FREQUENCY: Duration = Duration::from_secs(60);

/// A watcher with a deadline gets its last bookmark this long before it, so a client that
/// re-watches at the deadline resumes from a recent revision (Kubernetes: "right before the
/// watcher timeout - for now we simply set it 2s before the deadline").
pub const BOOKMARK_BEFORE_DEADLINE: Duration = Duration::from_secs(2);

const _: () = assert!(BOOKMARK_BEFORE_DEADLINE.as_secs() < BOOKMARK_FREQUENCY.as_secs());

/// When a watcher's next bookmark is due, `now` and `deadline` measured from the cache's
/// clock base: a minute from now, or just before the deadline if that comes first; `None`
/// once even that moment has passed (the watch ends soon and needs no more bookmarks).
pub fn next_bookmark(now: Duration, deadline: Option<Duration>) -> Option<Duration> {
    let mut due = now + BOOKMARK_FREQUENCY;
    if let Some(deadline) = deadline {
        let before = deadline.saturating_sub(BOOKMARK_BEFORE_DEADLINE);
        if before < due {
            due = before;
        }
    }
    (due >= now).then_some(due)
}

/// The bucket a moment falls in: its whole second (Kubernetes keys buckets by
/// `nextTime.Unix()`, so a bookmark may go out up to a second early, never late).
pub fn bucket_of(at: Duration) -> u64 {
    at.as_secs()
}

/// Watchers filed by the whole second at which something is due for them.
#[derive(Debug, Default)]
pub struct Buckets {
    buckets: BTreeMap<u64, Vec<u64>>,
}

impl Buckets {
    /// Files `watcher` under `second`.
    pub fn add(&mut self, second: u64, watcher: u64) {
        self.buckets.entry(second).or_default().push(watcher);
    }

    /// Removes and returns, in one bulk, every watcher filed at or before `now_second`,
    /// with the second it was filed under.
    pub fn pop_due(&mut self, now_second: u64) -> Vec<(u64, u64)> {
        let later = self.buckets.split_off(&now_second.saturating_add(1));
        let due = std::mem::replace(&mut self.buckets, later);
        due.into_iter()
            .flat_map(|(second, watchers)| watchers.into_iter().map(move |w| (second, w)))
            .collect()
    }

    /// Buckets currently held (for tests and metrics).
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no watcher is filed.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Drops every entry (the cache terminated all its watchers).
    pub fn clear(&mut self) {
        self.buckets.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pop_takes_every_due_bucket_and_nothing_later() {
        let mut b = Buckets::default();
        for w in 0..1_000 {
            b.add(60 + w % 3, w); // seconds 60, 61, 62
        }
        b.add(120, 5_000);
        assert_eq!(b.len(), 4, "a bucket per second, not a timer per watcher");
        assert!(b.pop_due(59).is_empty());
        let due = b.pop_due(61);
        assert_eq!(due.len(), 667, "seconds 60 and 61 popped together");
        assert!(due.iter().all(|&(s, _)| s <= 61));
        assert_eq!(b.pop_due(119).len(), 333);
        assert_eq!(b.pop_due(u64::MAX), vec![(120, 5_000)]);
        assert!(b.is_empty());
    }

    #[test]
    fn bookmarks_come_every_minute_and_just_before_the_deadline() {
        let now = Duration::from_secs(100);
        assert_eq!(next_bookmark(now, None), Some(Duration::from_secs(160)));
        // A 10-second watch: its only bookmark is 2 s before it ends.
        assert_eq!(
            next_bookmark(now, Some(Duration::from_secs(110))),
            Some(Duration::from_secs(108))
        );
        // A long watch: the minute comes first.
        assert_eq!(
            next_bookmark(now, Some(Duration::from_secs(1_000))),
            Some(Duration::from_secs(160))
        );
        // Past the pre-deadline moment: no more bookmarks.
        assert_eq!(next_bookmark(now, Some(Duration::from_secs(101))), None);
        assert_eq!(bucket_of(Duration::from_millis(108_999)), 108);
    }
}
