//! Errors of the Raft layer. Each is a one-line message for the operator.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RaftError {
    /// A flag or the cluster description is wrong; the text says which and why.
    #[error("{0}")]
    Config(String),
    /// The disk said no.
    #[error("raft log: {0}")]
    Storage(String),
    /// The log on disk is not what skerry wrote.
    #[error("raft log is corrupt: {0}")]
    Corrupt(String),
    /// raft-rs refused something.
    #[error("raft: {0}")]
    Raft(String),
    #[error("store: {0}")]
    Store(#[from] skerry_store::StoreError),
}

impl RaftError {
    pub(crate) fn storage(e: impl std::fmt::Display) -> Self {
        RaftError::Storage(e.to_string())
    }
}
