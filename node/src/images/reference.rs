//! Image references in the normalized form containerd's CRI plugin stores and resolves
//! (`docker.io/library/busybox:latest`), as docker's `reference.ParseNormalizedNamed` and
//! `TagNameOnly` make them (`github.com/distribution/reference`, `normalize.go`).

/// The longest repository name (`reference.go`, `NameTotalLengthMax`).
pub const NAME_TOTAL_LENGTH_MAX: usize = 255;

/// The longest tag (`regexp.go`, `tag = [\w][\w.-]{0,127}`).
pub const TAG_LENGTH_MAX: usize = 128;

const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
const DEFAULT_TAG: &str = "latest";

/// Why a reference is not valid.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid image reference {reference:?}: {why}")]
pub struct ReferenceError {
    pub reference: String,
    pub why: &'static str,
}

/// Normalizes `reference` (`busybox`, `busybox:1.36`, `my.registry:5000/app@sha256:...`) to
/// `domain/path[:tag][@digest]`, with docker.io, `library/` and `:latest` filled in.
pub fn normalize(reference: &str) -> Result<String, ReferenceError> {
    let err = |why| ReferenceError {
        reference: reference.to_string(),
        why,
    };
    if reference.is_empty() {
        return Err(err("empty"));
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (reference, None),
    };
    if let Some(digest) = digest {
        let hex = digest
            .strip_prefix("sha256:")
            .ok_or_else(|| err("only sha256 digests are supported"))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(err("a sha256 digest is 64 lowercase hex digits"));
        }
    }
    // A tag is after the last ':' that comes after the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let mut bytes = tag.bytes();
        let first_ok = bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !first_ok
            || tag.len() > TAG_LENGTH_MAX
            || !bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(err("a tag is [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"));
        }
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, path))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first, path.to_string())
        }
        _ => (DEFAULT_DOMAIN, name.to_string()),
    };
    let domain = if domain == LEGACY_DEFAULT_DOMAIN {
        DEFAULT_DOMAIN
    } else {
        domain
    };
    let path = if domain == DEFAULT_DOMAIN && !path.contains('/') {
        format!("{OFFICIAL_REPO_PREFIX}{path}")
    } else {
        path
    };
    if path.is_empty()
        || path
            .split('/')
            .any(|component| !valid_path_component(component))
    {
        return Err(err(
            "a repository path is lowercase alphanumeric components separated by '/', '.', '_', \
             '__' or '-'",
        ));
    }
    if !valid_domain(domain) {
        return Err(err("invalid registry domain"));
    }
    let full_name = format!("{domain}/{path}");
    if full_name.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(err("the repository name is longer than 255 characters"));
    }
    let mut out = full_name;
    match (tag, digest) {
        (Some(tag), _) => {
            out.push(':');
            out.push_str(tag);
        }
        (None, None) => {
            out.push(':');
            out.push_str(DEFAULT_TAG);
        }
        (None, Some(_)) => {}
    }
    if let Some(digest) = digest {
        out.push('@');
        out.push_str(digest);
    }
    Ok(out)
}

/// `host[:port]`, the host's dot-separated labels alphanumeric at both ends (`regexp.go`,
/// `domainComponent`).
fn valid_domain(domain: &str) -> bool {
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    let label_ok = |label: &str| {
        let b = label.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
    };
    host.split('.').all(label_ok)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
}

/// `[a-z0-9]+` joined by `.`, `_`, `__` or `-`s (`regexp.go`, `pathComponent`).
fn valid_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    if bytes.is_empty()
        || !bytes[0].is_ascii_alphanumeric()
        || !bytes[bytes.len() - 1].is_ascii_alphanumeric()
    {
        return false;
    }
    let mut separator = 0usize;
    for &b in bytes {
        if b.is_ascii_lowercase() || b.is_ascii_digit() {
            separator = 0;
        } else if matches!(b, b'.' | b'_' | b'-') {
            separator += 1;
            // `__` is allowed, `-` runs too; `..`, `._` are not.
            if separator > 1 && b != b'-' && !(b == b'_' && separator == 2) {
                return false;
            }
        } else {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_as_docker_does() {
        for (input, want) in [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("index.docker.io/me/app", "docker.io/me/app:latest"),
            ("me/app:v1", "docker.io/me/app:v1"),
            ("localhost/app", "localhost/app:latest"),
            ("localhost:5000/a/b:c", "localhost:5000/a/b:c"),
            ("skerry.local/pause:1", "skerry.local/pause:1"),
            ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"),
            (
                "busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "docker.io/library/busybox@sha256:\
                 0000000000000000000000000000000000000000000000000000000000000000",
            ),
        ] {
            assert_eq!(normalize(input).as_deref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn refuses_what_docker_refuses() {
        for input in [
            "",
            "Busybox",
            "busybox:",
            "busybox:-x",
            "a//b",
            "busybox@md5:00",
            "../x",
        ] {
            assert!(normalize(input).is_err(), "{input:?} should be refused");
        }
    }
}
