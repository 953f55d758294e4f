//! What a node needs from its distribution before it can run a pod, and which of it is
//! missing: containerd and its runc shim, runc, the CNI plugins the pod network is made of,
//! catatonit, the static init the pause image is built from, and `nft`, which the node's
//! network (`skerry-net`: the service proxy, the egress masquerade) programs the kernel with. A box without them still
//! serves the control plane; the node agent registers the Node NotReady with the reason, and
//! `skerry server` prints one line naming the Debian packages to install
//! (`scripts/node-packages` installs them, as `.ci/run` does).

use std::path::Path;

use crate::containerd::config::cni_bin_dir;
use crate::containerd::{REQUIRED_BINARIES, find_on_path};
use crate::images::build::CATATONIT;

/// The CNI plugins skerry's conflist chains (`cni.rs`), in the plugin dir; Debian's
/// `containernetworking-plugins` ships them.
pub const CNI_PLUGINS: &[&str] = &["bridge", "host-local", "loopback", "portmap"];
/// The Debian package of the CNI plugins.
pub const CNI_PACKAGE: &str = "containernetworking-plugins";
/// The Debian package of catatonit.
pub const CATATONIT_PACKAGE: &str = "catatonit";
/// The binaries the node's network runs, with their Debian packages: `nft` applies the service
/// proxy's and the masquerade's rules, one transaction per sync.
pub const NETWORK_BINARIES: &[(&str, &str)] = &[("nft", "nftables")];

/// Every Debian package a node needs, in install order (`scripts/node-packages` names the
/// same list; a test keeps the two in step).
pub fn all() -> Vec<&'static str> {
    let mut packages: Vec<&str> = Vec::new();
    for (_, package) in REQUIRED_BINARIES {
        if !packages.contains(package) {
            packages.push(package);
        }
    }
    packages.extend([CNI_PACKAGE, CATATONIT_PACKAGE]);
    packages.extend(NETWORK_BINARIES.iter().map(|(_, package)| *package));
    packages
}

/// The packages of [`all`] with something missing on this machine, each once: a binary not on
/// `PATH`, a CNI plugin not in the plugin dir, catatonit not at its path.
pub fn missing() -> Vec<&'static str> {
    let plugin_dir = cni_bin_dir();
    missing_with(
        |name| find_on_path(name).is_some(),
        |plugin| is_file(&plugin_dir.join(plugin)),
        || is_file(Path::new(CATATONIT)),
    )
}

fn is_file(path: &Path) -> bool {
    path.is_file()
}

fn missing_with(
    on_path: impl Fn(&str) -> bool,
    plugin: impl Fn(&str) -> bool,
    catatonit: impl Fn() -> bool,
) -> Vec<&'static str> {
    let mut missing: Vec<&'static str> = Vec::new();
    let mut add = |package: &'static str| {
        if !missing.contains(&package) {
            missing.push(package);
        }
    };
    for (binary, package) in REQUIRED_BINARIES {
        if !on_path(binary) {
            add(package);
        }
    }
    if !CNI_PLUGINS.iter().all(|p| plugin(p)) {
        add(CNI_PACKAGE);
    }
    if !catatonit() {
        add(CATATONIT_PACKAGE);
    }
    for (binary, package) in NETWORK_BINARIES {
        if !on_path(binary) {
            add(package);
        }
    }
    missing
}

/// The one line `skerry server` prints when `missing` is not empty, and the reason the Node
/// carries in its Ready condition.
pub fn message(missing: &[&str]) -> String {
    format!(
        "this node runs no pods until the Debian package(s) {} are installed (as root: apt-get install {}, or scripts/node-packages); the control plane serves and the Node is NotReady",
        missing.join(" "),
        missing.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_missing_piece_names_its_package_once() {
        assert!(missing_with(|_| true, |_| true, || true).is_empty());
        assert_eq!(
            missing_with(|b| b == "runc" || b == "nft", |_| true, || true),
            vec!["containerd"],
            "containerd and its shim are one package"
        );
        assert_eq!(
            missing_with(|_| false, |p| p != "portmap", || false),
            vec![
                "containerd",
                "runc",
                CNI_PACKAGE,
                CATATONIT_PACKAGE,
                "nftables"
            ]
        );
        assert_eq!(
            missing_with(|b| b != "nft", |_| true, || true),
            vec!["nftables"],
            "no service routes without nft"
        );
    }

    #[test]
    fn the_install_script_installs_every_package() {
        let script = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/node-packages"),
        )
        .expect("scripts/node-packages");
        for package in all() {
            assert!(
                script.split_whitespace().any(|w| w == package),
                "scripts/node-packages does not name {package}"
            );
        }
    }
}
