//! Names outside the cluster: forwarded to the node's upstream resolvers, through a cache.
//!
//! This is CoreDNS's `forward . /etc/resolv.conf` and `cache 30` of kubeadm's Corefile, in one
//! piece:
//! - the upstreams are the `nameserver` lines of a resolv.conf ([`upstreams`]); loopback
//!   addresses are skipped, because a stub resolver on the node's loopback (systemd-resolved's
//!   `127.0.0.53`, a dnsmasq) may hand the question back to cluster DNS — CoreDNS's `loop`
//!   plugin exists for that loop. When only loopback stubs are listed, systemd-resolved's own
//!   list of upstreams ([`SYSTEMD_RESOLVED_UPSTREAMS`], what the kubelet's `--resolv-conf` is
//!   pointed at on such hosts) is read instead, and failing that the stubs are used with a
//!   warning, never our own listen addresses;
//! - a question goes over UDP with EDNS, and again over TCP when the answer comes back
//!   truncated; each upstream in turn until one answers;
//! - answers are cached ([`Cache`]): positive ones for their smallest TTL, negative ones
//!   (NXDOMAIN, NODATA) for their SOA's negative TTL, both bounded as CoreDNS bounds them, and
//!   the cache holds at most [`CACHE_CAPACITY`] entries.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use hickory_server::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_server::proto::rr::{DNSClass, Name, RData, RecordType};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UdpSocket};
use tracing::{debug, warn};

use super::metrics::Metrics;
use super::zone::Answer;

/// The port of a `nameserver` line (resolv.conf has no syntax for another).
pub const DNS_PORT: u16 = 53;

/// Where systemd-resolved lists the upstream servers behind its `127.0.0.53` stub: the file
/// Kubernetes' docs tell the kubelet's `--resolv-conf` to use on such hosts to avoid the loop.
pub const SYSTEMD_RESOLVED_UPSTREAMS: &str = "/run/systemd/resolve/resolv.conf";

/// How long one upstream gets to answer one question: CoreDNS `forward`'s read timeout
/// (`plugin/forward/proxy.go`, 2 s), after which the next upstream is asked.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// The EDNS payload size offered to upstreams: DNS Flag Day 2020's 1232 bytes, the size that
/// fits any path's MTU without fragmentation (what CoreDNS and hickory advertise).
pub const EDNS_PAYLOAD: u16 = 1232;

/// The biggest DNS message over TCP (a two-byte length prefix).
const MAX_TCP_MESSAGE: usize = u16::MAX as usize;

/// Entries the cache holds at most: CoreDNS `cache`'s default capacity
/// (`plugin/cache/cache.go` `defaultCap`, 9984 = 256 shards of 39).
pub const CACHE_CAPACITY: usize = 9984;

/// The longest a positive answer is cached: CoreDNS `cache`'s `maxTTL` (1 h).
pub const MAX_POSITIVE_TTL: u32 = 3600;
/// The longest a negative answer is cached: CoreDNS `cache`'s `maxNTTL` (30 min).
pub const MAX_NEGATIVE_TTL: u32 = 1800;
/// The shortest any answer is cached: CoreDNS `cache`'s `minTTL` and `minNTTL` (5 s), so a
/// TTL-0 answer does not send every repeat upstream.
pub const MIN_CACHE_TTL: u32 = 5;

/// The upstream resolvers from the resolv.conf at `path`, with loopback addresses and
/// `own` (the DNS server's listen addresses) left out; see the module doc for the fallbacks.
/// An empty list means forwarded questions are answered SERVFAIL (logged here).
pub fn upstreams(path: &Path, own: &[IpAddr]) -> Vec<SocketAddr> {
    let listed = read_nameservers(path);
    let (usable, loopback): (Vec<IpAddr>, Vec<IpAddr>) = listed
        .iter()
        .copied()
        .filter(|ip| !own.contains(ip))
        .partition(|ip| !ip.is_loopback());
    if !usable.is_empty() {
        return usable
            .into_iter()
            .map(|ip| SocketAddr::new(ip, DNS_PORT))
            .collect();
    }
    if !loopback.is_empty() {
        let behind_stub: Vec<IpAddr> = read_nameservers(Path::new(SYSTEMD_RESOLVED_UPSTREAMS))
            .into_iter()
            .filter(|ip| !ip.is_loopback() && !own.contains(ip))
            .collect();
        if !behind_stub.is_empty() {
            warn!(
                resolv_conf = %path.display(),
                fallback = SYSTEMD_RESOLVED_UPSTREAMS,
                "cluster DNS: the node's resolv.conf lists only loopback stubs; forwarding to systemd-resolved's upstreams instead"
            );
            return behind_stub
                .into_iter()
                .map(|ip| SocketAddr::new(ip, DNS_PORT))
                .collect();
        }
        warn!(
            resolv_conf = %path.display(),
            stubs = ?loopback,
            "cluster DNS: the node's resolv.conf lists only loopback stubs and no upstream is known behind them; forwarding to the stubs, which loops if they forward back to cluster DNS"
        );
        return loopback
            .into_iter()
            .map(|ip| SocketAddr::new(ip, DNS_PORT))
            .collect();
    }
    tracing::error!(
        resolv_conf = %path.display(),
        "cluster DNS: no usable nameserver in the node's resolv.conf; names outside the cluster will be answered SERVFAIL"
    );
    Vec::new()
}

/// The `nameserver` addresses of a resolv.conf (none if it cannot be read). A scoped IPv6
/// address (`fe80::1%eth0`) is taken without its zone.
fn read_nameservers(path: &Path) -> Vec<IpAddr> {
    let Ok(text) = std::fs::read_to_string(path) else {
        debug!(path = %path.display(), "cluster DNS: resolv.conf not readable");
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            let addr = words.next()?;
            addr.split('%').next()?.parse().ok()
        })
        .collect()
}

/// The cache key: the question, lowercased.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Key {
    name: Name,
    rtype: RecordType,
    class: DNSClass,
}

/// One cached answer.
struct Entry {
    answer: Answer,
    stored: Instant,
    ttl: u32,
}

/// The forwarder's cache: TTL-bounded, size-bounded; clones share it.
#[derive(Clone)]
pub struct Cache {
    entries: Arc<Mutex<HashMap<Key, Entry>>>,
    capacity: usize,
}

impl Cache {
    /// An empty cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> Cache {
        Cache {
            entries: Arc::default(),
            capacity: capacity.max(1),
        }
    }

    /// Entries held (expired ones included until they are looked up or evicted).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cached answer with its TTLs counted down, if still fresh.
    fn get(&self, key: &Key) -> Option<Answer> {
        let mut entries = self.entries.lock();
        let entry = entries.get(key)?;
        let age = u32::try_from(entry.stored.elapsed().as_secs()).unwrap_or(u32::MAX);
        if age >= entry.ttl {
            entries.remove(key);
            return None;
        }
        let mut answer = entry.answer.clone();
        for r in answer
            .answers
            .iter_mut()
            .chain(answer.authorities.iter_mut())
            .chain(answer.additionals.iter_mut())
        {
            r.decrement_ttl(age);
        }
        Some(answer)
    }

    /// Stores `answer` if it is cacheable (NOERROR or NXDOMAIN with a TTL to go by).
    fn put(&self, key: Key, answer: &Answer) {
        let Some(ttl) = cache_ttl(answer) else {
            return;
        };
        let mut entries = self.entries.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            // Expired entries first; otherwise an arbitrary one (CoreDNS evicts a random
            // entry of a full shard).
            let now = Instant::now();
            entries.retain(|_, e| now.duration_since(e.stored).as_secs() < u64::from(e.ttl));
            if entries.len() >= self.capacity
                && let Some(victim) = entries.keys().next().cloned()
            {
                entries.remove(&victim);
            }
        }
        entries.insert(
            key,
            Entry {
                answer: answer.clone(),
                stored: Instant::now(),
                ttl,
            },
        );
    }
}

/// How long `answer` may be cached, or `None` if not at all.
fn cache_ttl(answer: &Answer) -> Option<u32> {
    let negative = answer.rcode == ResponseCode::NXDomain
        || (answer.rcode == ResponseCode::NoError && answer.answers.is_empty());
    if negative {
        // RFC 2308: the SOA's TTL, bounded by its minimum field.
        let soa = answer.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
            _ => None,
        })?;
        return Some(soa.clamp(MIN_CACHE_TTL, MAX_NEGATIVE_TTL));
    }
    if answer.rcode != ResponseCode::NoError {
        return None;
    }
    let ttl = answer.answers.iter().map(|r| r.ttl).min()?;
    Some(ttl.clamp(MIN_CACHE_TTL, MAX_POSITIVE_TTL))
}

/// Forwards questions to the upstreams through the cache.
#[derive(Clone)]
pub struct Forwarder {
    upstreams: Arc<[SocketAddr]>,
    cache: Cache,
    metrics: Arc<Metrics>,
    timeout: Duration,
}

impl Forwarder {
    /// A forwarder to `upstreams` with a cache of `capacity` entries.
    pub fn new(upstreams: Vec<SocketAddr>, capacity: usize, metrics: Arc<Metrics>) -> Forwarder {
        Forwarder {
            upstreams: upstreams.into(),
            cache: Cache::new(capacity),
            metrics,
            timeout: UPSTREAM_TIMEOUT,
        }
    }

    /// The cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The answer to one question: from the cache, or from the first upstream that answers
    /// (SERVFAIL if none does).
    pub async fn resolve(&self, name: &Name, rtype: RecordType, class: DNSClass) -> Answer {
        let key = Key {
            name: name.to_lowercase(),
            rtype,
            class,
        };
        if let Some(answer) = self.cache.get(&key) {
            self.metrics.cache_hit(answer_is_denial(&answer));
            return answer;
        }
        self.metrics.cache_miss();
        let mut query = Message::query();
        query.metadata.recursion_desired = true;
        let mut q = Query::query(name.clone(), rtype);
        q.set_query_class(class);
        query.add_query(q);
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        query.set_edns(edns);
        for upstream in self.upstreams.iter() {
            match exchange(*upstream, &query, self.timeout).await {
                Ok(response) => {
                    let answer = Answer {
                        rcode: response.metadata.response_code,
                        answers: response.answers,
                        authorities: response.authorities,
                        additionals: response.additionals,
                    };
                    if answer.rcode == ResponseCode::ServFail
                        || answer.rcode == ResponseCode::Refused
                    {
                        debug!(%upstream, rcode = ?answer.rcode, "cluster DNS: upstream declined; trying the next");
                        continue;
                    }
                    self.cache.put(key, &answer);
                    return answer;
                }
                Err(e) => debug!(%upstream, error = %e, "cluster DNS: upstream failed"),
            }
        }
        Answer {
            rcode: ResponseCode::ServFail,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
        }
    }
}

fn answer_is_denial(a: &Answer) -> bool {
    a.rcode == ResponseCode::NXDomain || a.answers.is_empty()
}

/// One question to `server`: over UDP, and again over TCP if the answer is truncated.
pub async fn exchange(
    server: SocketAddr,
    query: &Message,
    timeout: Duration,
) -> anyhow::Result<Message> {
    let response = exchange_udp(server, query, timeout).await?;
    if response.metadata.truncation {
        return exchange_tcp(server, query, timeout).await;
    }
    Ok(response)
}

/// One question over UDP; answers with another ID (or not answers at all) are ignored.
pub async fn exchange_udp(
    server: SocketAddr,
    query: &Message,
    timeout: Duration,
) -> anyhow::Result<Message> {
    let bind: SocketAddr = if server.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let socket = UdpSocket::bind(bind).await.context("bind a UDP socket")?;
    socket
        .connect(server)
        .await
        .context("connect the UDP socket")?;
    let bytes = query.to_vec().context("encode the question")?;
    socket.send(&bytes).await.context("send the question")?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut buf = vec![0u8; MAX_TCP_MESSAGE];
    loop {
        let n = tokio::time::timeout_at(deadline, socket.recv(&mut buf))
            .await
            .map_err(|_| anyhow!("no answer from {server} within {timeout:?}"))?
            .context("receive the answer")?;
        let Some(bytes) = buf.get(..n) else {
            continue;
        };
        match Message::from_vec(bytes) {
            Ok(m) if is_answer_to(&m, query) => return Ok(m),
            Ok(_) => debug!(%server, "cluster DNS: ignoring an answer to another question"),
            Err(e) => debug!(%server, error = %e, "cluster DNS: ignoring an undecodable answer"),
        }
    }
}

/// One question over TCP (RFC 1035 4.2.2: each message behind its two-byte length).
pub async fn exchange_tcp(
    server: SocketAddr,
    query: &Message,
    timeout: Duration,
) -> anyhow::Result<Message> {
    let work = async {
        let mut stream = TcpStream::connect(server).await.context("connect")?;
        let bytes = query.to_vec().context("encode the question")?;
        let len = u16::try_from(bytes.len()).context("question too long")?;
        stream.write_all(&len.to_be_bytes()).await?;
        stream.write_all(&bytes).await?;
        let mut len = [0u8; 2];
        stream
            .read_exact(&mut len)
            .await
            .context("read the length")?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream
            .read_exact(&mut buf)
            .await
            .context("read the answer")?;
        let m = Message::from_vec(&buf).context("decode the answer")?;
        if !is_answer_to(&m, query) {
            bail!("{server} answered another question");
        }
        Ok(m)
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| anyhow!("no answer from {server} over TCP within {timeout:?}"))?
}

fn is_answer_to(m: &Message, query: &Message) -> bool {
    m.metadata.id == query.metadata.id
        && m.metadata.message_type == MessageType::Response
        && m.metadata.op_code == OpCode::Query
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::testing::Upstream;
    use super::*;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).expect("a valid name")
    }

    #[tokio::test]
    async fn positive_answers_are_cached_and_counted() {
        let up = Upstream::start(&[("example.org.", vec![Ipv4Addr::new(192, 0, 2, 1)])])
            .await
            .expect("upstream");
        let metrics = Arc::new(Metrics::new());
        let f = Forwarder::new(vec![up.addr], CACHE_CAPACITY, metrics.clone());
        let first = f
            .resolve(&name("example.org."), RecordType::A, DNSClass::IN)
            .await;
        assert_eq!(first.rcode, ResponseCode::NoError);
        assert_eq!(first.answers.len(), 1);
        // Another case is the same question.
        let second = f
            .resolve(&name("EXAMPLE.org."), RecordType::A, DNSClass::IN)
            .await;
        assert_eq!(second.answers, first.answers);
        assert_eq!(up.udp_queries(), 1, "the second answer came from the cache");
        assert_eq!(metrics.cache_misses(), 1);
        assert_eq!(metrics.cache_hits("success"), 1);
        assert_eq!(metrics.cache_hits("denial"), 0);
    }

    #[tokio::test]
    async fn negative_answers_are_cached() {
        let up = Upstream::start(&[]).await.expect("upstream");
        let metrics = Arc::new(Metrics::new());
        let f = Forwarder::new(vec![up.addr], CACHE_CAPACITY, metrics.clone());
        for _ in 0..3 {
            let a = f
                .resolve(&name("missing.example."), RecordType::A, DNSClass::IN)
                .await;
            assert_eq!(a.rcode, ResponseCode::NXDomain);
        }
        assert_eq!(up.udp_queries(), 1);
        assert_eq!(metrics.cache_hits("denial"), 2);
    }

    #[tokio::test]
    async fn truncated_answers_are_asked_again_over_tcp() {
        let many: Vec<Ipv4Addr> = (1..=60).map(|i| Ipv4Addr::new(192, 0, 2, i)).collect();
        let up = Upstream::start(&[("big.example.", many)])
            .await
            .expect("upstream");
        let f = Forwarder::new(vec![up.addr], CACHE_CAPACITY, Arc::new(Metrics::new()));
        let a = f
            .resolve(&name("big.example."), RecordType::A, DNSClass::IN)
            .await;
        assert_eq!(a.answers.len(), 60);
        assert_eq!((up.udp_queries(), up.tcp_queries()), (1, 1));
    }

    #[tokio::test]
    async fn a_dead_upstream_is_skipped_and_none_left_is_servfail() {
        let up = Upstream::start(&[("example.org.", vec![Ipv4Addr::new(192, 0, 2, 1)])])
            .await
            .expect("upstream");
        // A port nothing answers on (bound, then closed).
        let dead = UdpSocket::bind("127.0.0.1:0")
            .await
            .and_then(|s| s.local_addr())
            .expect("a port");
        let mut f = Forwarder::new(
            vec![dead, up.addr],
            CACHE_CAPACITY,
            Arc::new(Metrics::new()),
        );
        f.timeout = Duration::from_millis(300);
        let a = f
            .resolve(&name("example.org."), RecordType::A, DNSClass::IN)
            .await;
        assert_eq!(a.rcode, ResponseCode::NoError);
        assert_eq!(a.answers.len(), 1);
        let none = Forwarder::new(Vec::new(), CACHE_CAPACITY, Arc::new(Metrics::new()));
        let a = none
            .resolve(&name("example.org."), RecordType::A, DNSClass::IN)
            .await;
        assert_eq!(a.rcode, ResponseCode::ServFail);
    }

    #[tokio::test]
    async fn the_cache_is_bounded() {
        let names: Vec<(String, Vec<Ipv4Addr>)> = (0..20)
            .map(|i| (format!("n{i}.example."), vec![Ipv4Addr::new(192, 0, 2, 1)]))
            .collect();
        let refs: Vec<(&str, Vec<Ipv4Addr>)> = names
            .iter()
            .map(|(n, ips)| (n.as_str(), ips.clone()))
            .collect();
        let up = Upstream::start(&refs).await.expect("upstream");
        let f = Forwarder::new(vec![up.addr], 8, Arc::new(Metrics::new()));
        for (n, _) in &names {
            f.resolve(&name(n), RecordType::A, DNSClass::IN).await;
        }
        assert_eq!(f.cache().len(), 8);
    }

    #[test]
    fn cache_ttls_are_bounded() {
        let rec = |ttl| {
            hickory_server::proto::rr::Record::from_rdata(
                name("a."),
                ttl,
                RData::A(Ipv4Addr::LOCALHOST.into()),
            )
        };
        let pos = |ttl| Answer {
            rcode: ResponseCode::NoError,
            answers: vec![rec(ttl)],
            authorities: Vec::new(),
            additionals: Vec::new(),
        };
        assert_eq!(cache_ttl(&pos(0)), Some(MIN_CACHE_TTL));
        assert_eq!(cache_ttl(&pos(120)), Some(120));
        assert_eq!(cache_ttl(&pos(86_400)), Some(MAX_POSITIVE_TTL));
        // NXDOMAIN without an SOA: nothing to go by, not cached; SERVFAIL never.
        let nx = Answer {
            rcode: ResponseCode::NXDomain,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
        };
        assert_eq!(cache_ttl(&nx), None);
        let sf = Answer {
            rcode: ResponseCode::ServFail,
            ..nx
        };
        assert_eq!(cache_ttl(&sf), None);
    }

    #[test]
    fn upstreams_skip_loopback_stubs_and_our_own_addresses() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("resolv.conf");
        std::fs::write(
            &path,
            "# a comment\nnameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver ::1\nnameserver 192.0.2.53\nnameserver fe80::1%eth0\nsearch example\noptions edns0\n",
        )
        .expect("write");
        let own: Vec<IpAddr> = vec!["10.0.0.2".parse().expect("ip")];
        let ups = upstreams(&path, &own);
        assert_eq!(
            ups,
            vec![
                "192.0.2.53:53".parse::<SocketAddr>().expect("addr"),
                "[fe80::1]:53".parse().expect("addr"),
            ]
        );
        std::fs::write(&path, "").expect("write");
        assert!(upstreams(&path, &own).is_empty());
        assert!(upstreams(&dir.path().join("absent"), &own).is_empty());
    }
}
