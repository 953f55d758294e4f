//! Revisions: the `(main, sub)` pair that orders every change in the store.
//!
//! `main` is etcd's global revision, bumped once per write transaction; `sub` numbers the
//! changes inside one transaction. Rows on disk are keyed by the pair in big-endian order, so
//! a scan of the table is a scan of the history in commit order.

/// One change's position in the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rev {
    /// The store revision of the write transaction.
    pub main: i64,
    /// The change's number inside its transaction, from 0.
    pub sub: i64,
}

impl Rev {
    pub const fn new(main: i64, sub: i64) -> Self {
        Self { main, sub }
    }

    /// The first change of revision `main`: every change of `main` sorts at or after it.
    pub const fn first_of(main: i64) -> Self {
        Self { main, sub: 0 }
    }

    /// The redb row key: `main` then `sub`, both as unsigned so the tuple order is history order.
    pub fn to_row_key(self) -> (u64, u64) {
        (
            u64::try_from(self.main).unwrap_or(0),
            u64::try_from(self.sub).unwrap_or(0),
        )
    }

    pub fn from_row_key((main, sub): (u64, u64)) -> Self {
        Self {
            main: i64::try_from(main).unwrap_or(i64::MAX),
            sub: i64::try_from(sub).unwrap_or(i64::MAX),
        }
    }
}
