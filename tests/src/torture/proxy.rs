//! A fault-injecting TCP proxy in front of each member's peer port, for runs without root.
//!
//! Member `i` listens for peers on a private port and advertises the proxy's port instead, so
//! every peer connection to `i` passes through proxy `i`. The proxy learns which member opened
//! a connection from the socket's owner (the connecting socket's inode in `/proc/net/tcp`,
//! then the member process holding it in `/proc/<pid>/fd`), which makes it one proxy per
//! ordered member pair in effect: data from `from` to `to` is cut when `(from, to)` is
//! blocked, in whichever direction the connection was opened.
//!
//! A blackholed direction stops being read, so TCP's flow control stalls the sender, as a
//! dropped packet's retransmissions would, and resumes when healed. A reset closes the
//! connection and refuses new ones while the pair is blocked.
//!
//! Invariant: every proxy task is owned by the `JoinSet` in `Proxies`, so dropping `Proxies`
//! stops them all and closes every connection.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::debug;

use super::MEMBERS;
use super::net::BlockMode;

/// Bytes a pump moves per read: a Raft append batch or a snapshot chunk in a few reads, small
/// enough that a blocked direction holds little. Semi-arbitrary.
const PUMP_BUFFER_BYTES: usize = 64 * 1024;

/// Pause after a failed accept (out of file descriptors, say) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The cut pairs and how they are cut.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub blocked: BTreeSet<(usize, usize)>,
    pub mode: BlockMode,
}

/// What to do with data from `from` to `to` (either unknown when the proxy could not tell).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Hold,
    Close,
}

impl Rules {
    /// Whether data from `from` to `to` is cut. A side the proxy could not identify counts as
    /// cut only when the known side is cut from every other member.
    fn cuts(&self, from: Option<usize>, to: Option<usize>) -> bool {
        match (from, to) {
            (Some(from), Some(to)) => self.blocked.contains(&(from, to)),
            (None, Some(to)) => (0..MEMBERS)
                .filter(|other| *other != to)
                .all(|other| self.blocked.contains(&(other, to))),
            (Some(from), None) => (0..MEMBERS)
                .filter(|other| *other != from)
                .all(|other| self.blocked.contains(&(from, other))),
            (None, None) => false,
        }
    }

    fn verdict(&self, from: Option<usize>, to: Option<usize>) -> Verdict {
        match self.mode {
            BlockMode::Blackhole if self.cuts(from, to) => Verdict::Hold,
            BlockMode::Reset if self.cuts(from, to) || self.cuts(to, from) => Verdict::Close,
            _ => Verdict::Pass,
        }
    }
}

/// The running proxies; see the module doc.
pub struct Proxies {
    /// `watch` rather than a lock: every pump waits for the rules to change, and one send
    /// wakes them all.
    rules: watch::Sender<Rules>,
    /// Member index -> process id, written by the cluster as members start and stop, read at
    /// each accept. A std mutex: held only to copy the vector, never across an await.
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    _tasks: JoinSet<()>,
}

impl Proxies {
    /// Starts one proxy per route `(listen, target)`; route `i` leads to member `i`.
    pub fn start(routes: &[(SocketAddr, SocketAddr)]) -> Result<Proxies> {
        let (rules, _) = watch::channel(Rules::default());
        let pids = Arc::new(Mutex::new(vec![None; routes.len()]));
        let mut tasks = JoinSet::new();
        for (to, (listen, target)) in routes.iter().enumerate() {
            let listener = std::net::TcpListener::bind(listen)
                .with_context(|| format!("bind proxy {listen}"))?;
            listener
                .set_nonblocking(true)
                .context("make proxy listener nonblocking")?;
            let listener = TcpListener::from_std(listener).context("register proxy listener")?;
            tasks.spawn(serve(
                listener,
                to,
                *target,
                rules.subscribe(),
                pids.clone(),
            ));
        }
        Ok(Proxies {
            rules,
            pids,
            _tasks: tasks,
        })
    }

    pub fn set_rules(&self, rules: Rules) {
        self.rules.send_replace(rules);
    }

    pub fn pids(&self) -> Arc<Mutex<Vec<Option<u32>>>> {
        self.pids.clone()
    }
}

/// Accepts connections to member `to` and forwards each to `target`.
async fn serve(
    listener: TcpListener,
    to: usize,
    target: SocketAddr,
    rules: watch::Receiver<Rules>,
    pids: Arc<Mutex<Vec<Option<u32>>>>,
) {
    let listen_port = listener.local_addr().map(|addr| addr.port()).unwrap_or(0);
    let mut connections = JoinSet::new();
    loop {
        let (inbound, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        let members: Vec<Option<u32>> = match pids.lock() {
            Ok(pids) => pids.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let from = socket_owner(peer.port(), listen_port, &members);
        debug!(?from, to, %peer, "proxy accepted a peer connection");
        connections.spawn(forward(inbound, from, to, target, rules.clone()));
    }
}

/// Forwards one connection both ways until either side closes or the rules close it.
async fn forward(
    inbound: TcpStream,
    from: Option<usize>,
    to: usize,
    target: SocketAddr,
    rules: watch::Receiver<Rules>,
) {
    if rules.borrow().verdict(from, Some(to)) == Verdict::Close {
        return;
    }
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (inbound_read, inbound_write) = inbound.into_split();
    let (outbound_read, outbound_write) = outbound.into_split();
    tokio::select! {
        _ = pump(inbound_read, outbound_write, from, Some(to), rules.clone()) => {}
        _ = pump(outbound_read, inbound_write, Some(to), from, rules) => {}
    }
}

/// Moves data from `from` to `to` while the rules let it; returns when the connection must
/// close.
async fn pump(
    mut reader: OwnedReadHalf,
    mut writer: OwnedWriteHalf,
    from: Option<usize>,
    to: Option<usize>,
    mut rules: watch::Receiver<Rules>,
) {
    let mut buffer = vec![0u8; PUMP_BUFFER_BYTES];
    loop {
        if !wait_for_pass(&mut rules, from, to).await {
            return;
        }
        let read = tokio::select! {
            read = reader.read(&mut buffer) => read,
            // Re-judge an idle connection when the rules change (a reset closes it now).
            changed = rules.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let length = match read {
            Ok(0) | Err(_) => return,
            Ok(length) => length,
        };
        // The rules may have changed while the data was on its way: hold it if so.
        if !wait_for_pass(&mut rules, from, to).await {
            return;
        }
        if writer.write_all(&buffer[..length]).await.is_err() {
            return;
        }
    }
}

/// Waits while data from `from` to `to` is held; false when the connection must close.
async fn wait_for_pass(
    rules: &mut watch::Receiver<Rules>,
    from: Option<usize>,
    to: Option<usize>,
) -> bool {
    loop {
        let verdict = rules.borrow_and_update().verdict(from, to);
        match verdict {
            Verdict::Pass => return true,
            Verdict::Close => return false,
            Verdict::Hold => {
                if rules.changed().await.is_err() {
                    return false;
                }
            }
        }
    }
}

/// The member whose process owns the loopback socket at `local_port` connected to
/// `remote_port`, if it is one of `pids` (index = member).
fn socket_owner(local_port: u16, remote_port: u16, pids: &[Option<u32>]) -> Option<usize> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inode = socket_inode(&table, local_port, remote_port)?;
    let needle = format!("socket:[{inode}]");
    for (member, pid) in pids.iter().enumerate() {
        let Some(pid) = pid else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == needle.as_str()) {
                return Some(member);
            }
        }
    }
    None
}

/// The inode of the socket in a `/proc/net/tcp` table whose local port is `local_port` and
/// remote port is `remote_port`. Lines read
/// `sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode`,
/// addresses as `HEXIP:HEXPORT`.
fn socket_inode(table: &str, local_port: u16, remote_port: u16) -> Option<u64> {
    let port = |address: &str| {
        address
            .rsplit_once(':')
            .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
    };
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, remote, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
        (port(local)? == local_port && port(remote)? == remote_port)
            .then(|| inode.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when \
                         retrnsmt   uid  timeout inode
   0: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0
   1: 0100007F:C350 0100007F:0CEA 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0
";

    #[test]
    fn finds_the_connecting_socket() {
        assert_eq!(socket_inode(TABLE, 0xC350, 0x0CEA), Some(4242));
        assert_eq!(socket_inode(TABLE, 0x0CEA, 0xC350), None);
        assert_eq!(socket_inode("garbage", 1, 2), None);
    }

    #[test]
    fn rules_cut_pairs_and_unknown_sides_only_when_isolated() {
        let mut rules = Rules {
            blocked: [(0, 1)].into_iter().collect(),
            mode: BlockMode::Blackhole,
        };
        assert_eq!(rules.verdict(Some(0), Some(1)), Verdict::Hold);
        assert_eq!(rules.verdict(Some(1), Some(0)), Verdict::Pass);
        assert_eq!(rules.verdict(None, Some(1)), Verdict::Pass);
        rules.blocked.insert((2, 1));
        assert_eq!(rules.verdict(None, Some(1)), Verdict::Hold);
        rules.mode = BlockMode::Reset;
        assert_eq!(rules.verdict(Some(1), Some(0)), Verdict::Close);
        assert_eq!(rules.verdict(Some(1), Some(2)), Verdict::Close);
        assert_eq!(rules.verdict(Some(0), Some(2)), Verdict::Pass);
    }

    #[tokio::test]
    async fn finds_its_own_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let client = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let (_server, peer) = listener.accept().await.expect("accept");
        assert_eq!(peer.port(), client.local_addr().expect("addr").port());
        let me = Some(std::process::id());
        assert_eq!(socket_owner(peer.port(), port, &[None, me]), Some(1));
    }
}
