//! The open-file limit of `skerry server`, raised at start as Go programs raise theirs.
//!
//! Every connection, accepted or being accepted, costs a descriptor, and many systems start
//! processes with a soft `RLIMIT_NOFILE` of 1,024 under a hard limit hundreds of times higher.
//! Since Go 1.19 every Go program raises its soft limit to the hard one when it starts
//! (`syscall/rlimit.go`, `init`), which is why etcd and Kubernetes' components take thousands
//! of connections with no setup; `skerry server` does the same before it binds anything. (Go
//! also puts the old limit back for the programs it executes; skerry executes none.)

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// What raising the limit did.
pub enum Raised {
    /// The soft limit went from the first number to the second (the hard limit).
    From(u64, u64),
    /// The soft limit already was the hard limit (or the hard limit is unlimited).
    Already,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit.
pub fn raise_open_file_limit() -> rustix::io::Result<Raised> {
    let limit = getrlimit(Resource::Nofile);
    match (limit.current, limit.maximum) {
        (Some(soft), Some(hard)) if soft < hard => {
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(hard),
                    maximum: Some(hard),
                },
            )?;
            Ok(Raised::From(soft, hard))
        }
        // An unlimited hard limit has no number to raise to (Linux caps descriptors at
        // `fs.nr_open` and refuses an unlimited soft limit).
        _ => Ok(Raised::Already),
    }
}
