//! The crate's error: every variant's text names what it was about (a flag and its file, a
//! certificate's path, the user a certificate was for), so a caller can print it as it is,
//! as `skerry server`'s one-line start-up errors do.

use std::io;

/// Why a certificate, key, file or TLS configuration could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading, writing or creating a file or directory failed: `what` says which and how
    /// ("read /x/ca.crt").
    #[error("{what}: {error}")]
    Io { what: String, error: io::Error },
    /// An input is not usable: a file that holds no PEM certificate, a key that does not
    /// belong to its certificate, a leaf another CA signed, an expired CA. The text is
    /// complete.
    #[error("{0}")]
    Invalid(String),
    /// rcgen could not make or sign a certificate (`what` says which).
    #[error("{what}: {error}")]
    Issue { what: String, error: rcgen::Error },
    /// rustls refused a piece of a configuration.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |error| Error::Io { what, error }
    }

    pub(crate) fn issue(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> Error {
        let what = what.into();
        move |error| Error::Issue { what, error }
    }
}
