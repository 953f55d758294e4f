//! Where the members live on the network and how the nemesis cuts them apart.
//!
//! As root ([`NetworkMode::Namespaces`]): each member runs in a network namespace of its own,
//! joined by a veth pair to a bridge in the root namespace; members are 10.77.0.1-3, the
//! clients (in the root namespace) reach them through the bridge at 10.77.0.254. A partition
//! is a set of `nft` drop (or reset) rules in the input chain of the receiving member's
//! namespace, keyed on the sender's address; clients are never cut off.
//!
//! Otherwise ([`NetworkMode::Proxy`]): members listen on loopback and advertise peer URLs that
//! point at a fault-injecting proxy per member, which tells the sending member by the socket's
//! owner; see `proxy`.
//!
//! Both cut the directed pairs `(from, to)` of a [`Partition`]: data from `from` does not
//! reach `to`. Invariant: everything `Network` creates is removed when it is dropped, and
//! `remove_leftovers` removes what a crashed run left under the same names.

use std::collections::BTreeSet;
use std::fmt;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use tracing::{debug, warn};

use super::MEMBERS;
use super::proxy::{Proxies, Rules};

/// Prefix of every namespace and link a run creates, so leftovers can be found by name.
/// Short because Linux interface names hold at most 15 bytes.
const NAME_PREFIX: &str = "skt-";

/// The bridge joining the members' veths in the root namespace.
const BRIDGE: &str = "skt-br0";

/// The members' subnet: 10.77.0.0/24, a private range unlikely to clash with a real network
/// (checked at setup). Member i is `.i+1`; the bridge, where clients come from, is `.254`.
const SUBNET_PREFIX: [u8; 3] = [10, 77, 0];
const BRIDGE_HOST: u8 = 254;
const SUBNET_BITS: u8 = 24;

/// etcd's well-known ports; every member has its own address, so they do not collide.
const CLIENT_PORT: u16 = 2379;
const PEER_PORT: u16 = 2380;

/// The nft table and chain the partitions live in, inside each member's namespace.
const NFT_TABLE: &str = "skerry_torture";
const NFT_CHAIN: &str = "input";

/// How the network is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkMode {
    /// Namespaces as root, proxies otherwise.
    Auto,
    Namespaces,
    Proxy,
}

impl NetworkMode {
    /// `Auto` decided by whether this process runs as root.
    pub fn resolve(self) -> NetworkMode {
        match self {
            NetworkMode::Auto if rustix::process::geteuid().is_root() => NetworkMode::Namespaces,
            NetworkMode::Auto => NetworkMode::Proxy,
            other => other,
        }
    }
}

impl fmt::Display for NetworkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetworkMode::Auto => "auto",
            NetworkMode::Namespaces => "netns",
            NetworkMode::Proxy => "proxy",
        })
    }
}

/// What a cut pair does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockMode {
    /// Packets vanish: connections stall until healed or timed out (nft `drop`; the proxy
    /// stops forwarding).
    #[default]
    Blackhole,
    /// Connections are reset and new ones refused (nft `reject with tcp reset`; the proxy
    /// closes them).
    Reset,
}

/// The directed pairs `(from, to)` whose traffic is cut, and how.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Partition {
    pub blocked: BTreeSet<(usize, usize)>,
    pub mode: BlockMode,
}

/// One member's addresses.
#[derive(Debug, Clone)]
pub struct MemberAddr {
    pub name: String,
    pub client_url: String,
    /// The peer URL the others use (`--initial-advertise-peer-urls`, `--initial-cluster`).
    pub peer_url: String,
    /// Where the member listens for peers (`--listen-peer-urls`); differs from `peer_url`
    /// when a proxy sits in between.
    pub listen_peer_url: String,
    /// The namespace to run the member in, if any.
    pub netns: Option<String>,
}

/// The members' network; see the module doc.
pub struct Network {
    mode: NetworkMode,
    members: Vec<MemberAddr>,
    inner: Inner,
}

enum Inner {
    Namespaces(Namespaces),
    Proxies(Proxies),
}

impl Network {
    /// Sets up the network for `MEMBERS` members in `mode` (`Auto` resolved).
    pub fn setup(mode: NetworkMode) -> Result<Network> {
        match mode.resolve() {
            NetworkMode::Namespaces => {
                let (namespaces, members) = Namespaces::create()?;
                Ok(Network {
                    mode: NetworkMode::Namespaces,
                    members,
                    inner: Inner::Namespaces(namespaces),
                })
            }
            _ => {
                let mut members = Vec::with_capacity(MEMBERS);
                let mut routes = Vec::with_capacity(MEMBERS);
                for i in 0..MEMBERS {
                    let [client, peer, proxy] = free_loopback_ports()?;
                    members.push(MemberAddr {
                        name: member_name(i),
                        client_url: format!("http://127.0.0.1:{client}"),
                        peer_url: format!("http://127.0.0.1:{proxy}"),
                        listen_peer_url: format!("http://127.0.0.1:{peer}"),
                        netns: None,
                    });
                    routes.push((
                        SocketAddr::from((Ipv4Addr::LOCALHOST, proxy)),
                        SocketAddr::from((Ipv4Addr::LOCALHOST, peer)),
                    ));
                }
                let proxies = Proxies::start(&routes)?;
                Ok(Network {
                    mode: NetworkMode::Proxy,
                    members,
                    inner: Inner::Proxies(proxies),
                })
            }
        }
    }

    pub fn mode(&self) -> NetworkMode {
        self.mode
    }

    pub fn members(&self) -> &[MemberAddr] {
        &self.members
    }

    /// Where the proxies learn which process is which member (`None` without proxies).
    pub fn pid_registry(&self) -> Option<Arc<Mutex<Vec<Option<u32>>>>> {
        match &self.inner {
            Inner::Namespaces(_) => None,
            Inner::Proxies(proxies) => Some(proxies.pids()),
        }
    }

    /// Cuts exactly the pairs of `partition` (replacing any earlier cut).
    pub fn apply(&self, partition: &Partition) -> Result<()> {
        match &self.inner {
            Inner::Namespaces(namespaces) => namespaces.apply(partition),
            Inner::Proxies(proxies) => {
                proxies.set_rules(Rules {
                    blocked: partition.blocked.clone(),
                    mode: partition.mode,
                });
                Ok(())
            }
        }
    }

    /// Removes every cut.
    pub fn heal(&self) -> Result<()> {
        self.apply(&Partition::default())
    }
}

/// A member's name, as `--name` and in `--initial-cluster`.
pub fn member_name(i: usize) -> String {
    format!("n{}", i + 1)
}

/// Three distinct free loopback ports: client, peer and proxy. The listeners are held until
/// all are chosen so they differ; another process may still take one before the member binds
/// it, which shows up as a startup failure naming the port.
fn free_loopback_ports() -> Result<[u16; 3]> {
    let listeners = [
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind a free port")?,
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind a free port")?,
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind a free port")?,
    ];
    let mut ports = [0u16; 3];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr().context("read bound port")?.port();
    }
    Ok(ports)
}

fn member_ip(i: usize) -> String {
    let [a, b, c] = SUBNET_PREFIX;
    format!("{a}.{b}.{c}.{}", i + 1)
}

fn netns_name(i: usize) -> String {
    format!("{NAME_PREFIX}{}", member_name(i))
}

/// The namespaces, veths and bridge of one run; removed on drop.
struct Namespaces {
    names: Vec<String>,
}

impl Namespaces {
    fn create() -> Result<(Namespaces, Vec<MemberAddr>)> {
        for tool in ["ip", "nft"] {
            if Command::new(tool)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_err()
            {
                bail!(
                    "`{tool}` is needed for the netns network (apt-get install -y iproute2 \
                     nftables), or use --network proxy"
                );
            }
        }
        let [a, b, c] = SUBNET_PREFIX;
        let subnet = format!("{a}.{b}.{c}.0/{SUBNET_BITS}");
        let clash = output(Command::new("ip").args(["-o", "addr", "show", "to", &subnet]))?;
        if !clash.trim().is_empty() {
            bail!(
                "{subnet} is already in use on this machine: {}",
                clash.trim()
            );
        }
        // From here on, Drop removes whatever was created.
        let mut namespaces = Namespaces { names: Vec::new() };
        run(Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"]))?;
        let bridge_addr = format!("{a}.{b}.{c}.{BRIDGE_HOST}/{SUBNET_BITS}");
        run(Command::new("ip").args(["addr", "add", &bridge_addr, "dev", BRIDGE]))?;
        run(Command::new("ip").args(["link", "set", BRIDGE, "up"]))?;
        let mut members = Vec::with_capacity(MEMBERS);
        for i in 0..MEMBERS {
            let ns = netns_name(i);
            run(Command::new("ip").args(["netns", "add", &ns]))?;
            namespaces.names.push(ns.clone());
            let host_side = format!("{NAME_PREFIX}v{}", i + 1);
            let member_side = format!("{NAME_PREFIX}p{}", i + 1);
            run(Command::new("ip").args([
                "link",
                "add",
                &host_side,
                "type",
                "veth",
                "peer",
                "name",
                &member_side,
            ]))?;
            run(Command::new("ip").args(["link", "set", &member_side, "netns", &ns]))?;
            run(Command::new("ip").args(["link", "set", &host_side, "master", BRIDGE]))?;
            run(Command::new("ip").args(["link", "set", &host_side, "up"]))?;
            let ip = member_ip(i);
            let addr = format!("{ip}/{SUBNET_BITS}");
            run(Command::new("ip").args(["-n", &ns, "link", "set", &member_side, "name", "eth0"]))?;
            run(Command::new("ip").args(["-n", &ns, "addr", "add", &addr, "dev", "eth0"]))?;
            run(Command::new("ip").args(["-n", &ns, "link", "set", "eth0", "up"]))?;
            run(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"]))?;
            nft(
                &ns,
                &format!(
                    "table inet {NFT_TABLE} {{\n  chain {NFT_CHAIN} {{\n    type filter hook \
                     input priority filter; policy accept;\n  }}\n}}\n"
                ),
            )?;
            members.push(MemberAddr {
                name: member_name(i),
                client_url: format!("http://{ip}:{CLIENT_PORT}"),
                peer_url: format!("http://{ip}:{PEER_PORT}"),
                listen_peer_url: format!("http://{ip}:{PEER_PORT}"),
                netns: Some(ns),
            });
        }
        Ok((namespaces, members))
    }

    fn apply(&self, partition: &Partition) -> Result<()> {
        for (to, ns) in self.names.iter().enumerate() {
            let mut script = format!("flush chain inet {NFT_TABLE} {NFT_CHAIN}\n");
            for (from, _) in partition.blocked.iter().filter(|(_, target)| *target == to) {
                let source = member_ip(*from);
                if partition.mode == BlockMode::Reset {
                    script.push_str(&format!(
                        "add rule inet {NFT_TABLE} {NFT_CHAIN} ip saddr {source} meta l4proto \
                         tcp reject with tcp reset\n"
                    ));
                }
                script.push_str(&format!(
                    "add rule inet {NFT_TABLE} {NFT_CHAIN} ip saddr {source} drop\n"
                ));
            }
            nft(ns, &script)?;
        }
        Ok(())
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.names {
            kill_namespace_processes(ns);
            if let Err(e) = run(Command::new("ip").args(["netns", "del", ns])) {
                warn!("failed to remove namespace {ns}: {e:#}");
            }
        }
        if let Err(e) = run(Command::new("ip").args(["link", "del", BRIDGE])) {
            warn!("failed to remove bridge {BRIDGE}: {e:#}");
        }
    }
}

/// Removes namespaces and links a crashed run left (found by `NAME_PREFIX`), killing the
/// processes still inside. Best effort, and silent when there is nothing or no `ip`.
pub fn remove_leftovers() {
    let Ok(list) = output(Command::new("ip").args(["netns", "list"])) else {
        return;
    };
    for ns in list
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(NAME_PREFIX))
    {
        warn!(
            namespace = ns,
            "removing a namespace left by an earlier torture run"
        );
        kill_namespace_processes(ns);
        if let Err(e) = run(Command::new("ip").args(["netns", "del", ns])) {
            warn!("failed to remove namespace {ns}: {e:#}");
        }
    }
    let Ok(links) = output(Command::new("ip").args(["-o", "link", "show"])) else {
        return;
    };
    for link in links.lines().filter_map(link_name) {
        if link.starts_with(NAME_PREFIX) {
            warn!(link, "removing a link left by an earlier torture run");
            // A veth goes away with its peer, so one listed a moment ago may be gone already.
            if let Err(e) = run(Command::new("ip").args(["link", "del", link]))
                && !format!("{e:#}").contains("Cannot find device")
            {
                warn!("failed to remove link {link}: {e:#}");
            }
        }
    }
}

/// The interface name in a line of `ip -o link show`: `7: skt-v1@if6: <...> ...`.
fn link_name(line: &str) -> Option<&str> {
    let name = line.split(": ").nth(1)?;
    Some(name.split('@').next().unwrap_or(name))
}

fn kill_namespace_processes(ns: &str) {
    let Ok(pids) = output(Command::new("ip").args(["netns", "pids", ns])) else {
        return;
    };
    for pid in pids
        .lines()
        .filter_map(|line| line.trim().parse::<u32>().ok())
    {
        let _ = super::lock::signal(pid, rustix::process::Signal::KILL);
    }
}

/// Loads an nft script into namespace `ns`.
fn nft(ns: &str, script: &str) -> Result<()> {
    debug!(ns, script, "nft");
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("run nft")?;
    child
        .stdin
        .take()
        .context("nft stdin")?
        .write_all(script.as_bytes())
        .context("write nft script")?;
    let out = child.wait_with_output().context("wait for nft")?;
    if !out.status.success() {
        bail!(
            "nft in {ns} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn run(command: &mut Command) -> Result<()> {
    output(command).map(drop)
}

/// Runs `command` and returns its stdout, failing with its stderr.
fn output(command: &mut Command) -> Result<String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_come_out_of_ip_link_lines() {
        assert_eq!(
            link_name("7: skt-v1@if6: <BROADCAST,MULTICAST> mtu 1500"),
            Some("skt-v1")
        );
        assert_eq!(
            link_name("3: skt-br0: <BROADCAST> mtu 1500"),
            Some("skt-br0")
        );
        assert_eq!(link_name("garbage"), None);
    }
}
