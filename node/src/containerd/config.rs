//! Where a supervised containerd keeps its files under skerry's data dir, and the config file
//! (containerd's version 2 format) skerry writes for it.
//!
//! Everything sits under `<data-dir>/agent/`, as k3s keeps its containerd under
//! `agent/containerd` and `agent/etc`: two skerry servers on one machine (the tests run
//! several) never share a root, a state dir or a socket.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Where the CNI plugins are looked for, in order: Debian's `containernetworking-plugins`
/// installs them in `/usr/lib/cni`; `/opt/cni/bin` is containerd's default and where upstream
/// tarballs go.
pub const CNI_BIN_DIRS: &[&str] = &["/usr/lib/cni", "/opt/cni/bin"];

/// The files and directories of one supervised containerd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `<data-dir>/agent`.
    pub agent_dir: PathBuf,
    /// containerd's `root`: content, snapshots, metadata.
    pub root: PathBuf,
    /// containerd's `state`: runtime state of tasks.
    pub state: PathBuf,
    /// The gRPC socket (CRI and containerd's own API).
    pub socket: PathBuf,
    /// The config file skerry writes.
    pub config: PathBuf,
    /// containerd's stdout and stderr.
    pub log: PathBuf,
    /// The pid of the containerd skerry started, to stop a leftover one after a crash.
    pub pid_file: PathBuf,
    /// The CNI config dir the CRI plugin reads (skerry's node writes the network config there).
    pub cni_conf_dir: PathBuf,
    /// containerd's registry hosts dir (`config_path`: `<host>/hosts.toml`).
    pub registry_config_dir: PathBuf,
    /// The folder of image tarballs imported at start and when one appears.
    pub images_dir: PathBuf,
}

impl Layout {
    /// The layout under `data_dir` (the `--data-dir` of `skerry server`).
    pub fn new(data_dir: &Path) -> Self {
        let agent_dir = data_dir.join("agent");
        Self {
            root: agent_dir.join("containerd"),
            state: agent_dir.join("run").join("containerd"),
            socket: agent_dir.join("run").join("containerd.sock"),
            config: agent_dir.join("etc").join("containerd").join("config.toml"),
            log: agent_dir.join("containerd.log"),
            pid_file: agent_dir.join("run").join("containerd.pid"),
            cni_conf_dir: agent_dir.join("etc").join("cni").join("net.d"),
            registry_config_dir: agent_dir.join("etc").join("containerd").join("certs.d"),
            images_dir: agent_dir.join("images"),
            agent_dir,
        }
    }

    /// The CRI endpoint of this containerd, as `--container-runtime-endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

/// The first CNI plugin dir that exists, else containerd's default.
pub fn cni_bin_dir() -> PathBuf {
    CNI_BIN_DIRS
        .iter()
        .map(PathBuf::from)
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| PathBuf::from(CNI_BIN_DIRS[CNI_BIN_DIRS.len() - 1]))
}

/// containerd's config: version 2, the CRI plugin with skerry's sandbox image, the overlayfs
/// snapshotter, runc through the v2 shim with the cgroupfs driver (the kubelet's default
/// `cgroupDriver`, so pods' cgroups are plain directories on cgroup v1 and v2 alike), CNI from
/// `cni_bin_dir` with its config under the data dir, registry hosts under the data dir, and the
/// streaming server (exec, attach, port-forward) on loopback only: the kubelet proxies it.
///
/// `restrict_oom_score_adj` raises the OOM score adjustments the CRI plugin asks runc for
/// that are below containerd's own to containerd's own (its `restrictOOMScoreAdj`; values at
/// or above it pass unchanged): needed where skerry runs without `CAP_SYS_RESOURCE` (a
/// container, some VMs, also as root), where the kernel refuses to lower a score below its
/// `oom_score_adj_min` and the sandbox's -998 (the kubelet's `qos.PodInfraOOMAdj`) makes runc
/// fail with "failed to update /proc/self/oom_score_adj: Permission denied". It hides no
/// score the kernel would have applied: Burstable and BestEffort scores (3 to 1000) are
/// positive and pass; Guaranteed's -997 is clamped only where it could not be set anyway.
/// With the capability (root on a host) it is off and every score is the kubelet's.
pub fn config_toml(
    layout: &Layout,
    sandbox_image: &str,
    cni_bin_dir: &Path,
    restrict_oom_score_adj: bool,
) -> String {
    let s = |p: &Path| toml_string(&p.display().to_string());
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    let mut out = String::new();
    // `writeln!` on a String cannot fail.
    let _ = writeln!(
        out,
        "# Written by skerry at every start; edits are overwritten."
    );
    let _ = writeln!(out, "version = 2");
    let _ = writeln!(out, "root = {}", s(&layout.root));
    let _ = writeln!(out, "state = {}", s(&layout.state));
    let _ = writeln!(out);
    let _ = writeln!(out, "[grpc]");
    let _ = writeln!(out, "  address = {}", s(&layout.socket));
    let _ = writeln!(out);
    let _ = writeln!(out, "[ttrpc]");
    let _ = writeln!(
        out,
        "  address = {}",
        s(&layout.socket.with_extension("sock.ttrpc"))
    );
    let _ = writeln!(out);
    // The opt plugin defaults to /opt/containerd, shared by every containerd on the machine.
    let _ = writeln!(out, "[plugins.\"io.containerd.internal.v1.opt\"]");
    let _ = writeln!(out, "  path = {}", s(&layout.root.join("opt")));
    let _ = writeln!(out);
    let _ = writeln!(out, "[{cri}]");
    let _ = writeln!(out, "  sandbox_image = {}", toml_string(sandbox_image));
    let _ = writeln!(out, "  stream_server_address = \"127.0.0.1\"");
    // Port 0: any free port; the kubelet learns the URL from each Exec/Attach answer.
    let _ = writeln!(out, "  stream_server_port = \"0\"");
    let _ = writeln!(out, "  enable_selinux = false");
    let _ = writeln!(out, "  restrict_oom_score_adj = {restrict_oom_score_adj}");
    let _ = writeln!(out);
    let _ = writeln!(out, "[{cri}.containerd]");
    let _ = writeln!(out, "  snapshotter = \"overlayfs\"");
    let _ = writeln!(out, "  default_runtime_name = \"runc\"");
    let _ = writeln!(out);
    let _ = writeln!(out, "[{cri}.containerd.runtimes.runc]");
    let _ = writeln!(out, "  runtime_type = \"io.containerd.runc.v2\"");
    let _ = writeln!(out);
    let _ = writeln!(out, "[{cri}.containerd.runtimes.runc.options]");
    let _ = writeln!(out, "  SystemdCgroup = false");
    let _ = writeln!(out);
    let _ = writeln!(out, "[{cri}.cni]");
    let _ = writeln!(out, "  bin_dir = {}", s(cni_bin_dir));
    let _ = writeln!(out, "  conf_dir = {}", s(&layout.cni_conf_dir));
    let _ = writeln!(out);
    let _ = writeln!(out, "[{cri}.registry]");
    let _ = writeln!(out, "  config_path = {}", s(&layout.registry_config_dir));
    out
}

/// Whether this process holds `CAP_SYS_RESOURCE` (capability 24, `linux/capability.h`), read
/// from the `CapEff` mask in `/proc/self/status`.
pub fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << CAP_SYS_RESOURCE) != 0)
}

/// A TOML basic string: quotes, backslashes and control characters escaped (also the
/// registries' `hosts.toml`).
pub(crate) fn toml_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_everything_under_the_data_dir() {
        let layout = Layout::new(Path::new("/data/x"));
        let toml = config_toml(
            &layout,
            "skerry.local/pause:1",
            Path::new("/usr/lib/cni"),
            true,
        );
        for want in [
            "version = 2",
            "root = \"/data/x/agent/containerd\"",
            "state = \"/data/x/agent/run/containerd\"",
            "address = \"/data/x/agent/run/containerd.sock\"",
            "sandbox_image = \"skerry.local/pause:1\"",
            "snapshotter = \"overlayfs\"",
            "runtime_type = \"io.containerd.runc.v2\"",
            "SystemdCgroup = false",
            "bin_dir = \"/usr/lib/cni\"",
            "conf_dir = \"/data/x/agent/etc/cni/net.d\"",
            "config_path = \"/data/x/agent/etc/containerd/certs.d\"",
            "stream_server_address = \"127.0.0.1\"",
            "restrict_oom_score_adj = true",
        ] {
            assert!(toml.contains(want), "missing {want:?} in\n{toml}");
        }
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000A\"");
    }
}
