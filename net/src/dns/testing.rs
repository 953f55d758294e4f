//! An upstream DNS server for tests and the benchmark: serves fixed answers on a loopback
//! port over UDP and TCP, as the node's resolver would, and counts the questions it gets —
//! which is how a test sees what the forwarder's cache spared it.
//!
//! It knows three kinds of names: those given to [`Upstream::start`] (A records, TTL
//! [`UPSTREAM_TTL`]), which answer NOERROR; any other name, NXDOMAIN with an SOA whose negative
//! TTL is [`UPSTREAM_TTL`]; and over UDP, an answer of more than [`UDP_LIMIT`] bytes is sent
//! truncated (TC, no records), so the client has to come back over TCP.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hickory_server::proto::op::{Message, MessageType, ResponseCode};
use hickory_server::proto::rr::rdata::{A, SOA};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;

/// The TTL of every answer, positive and negative.
pub const UPSTREAM_TTL: u32 = 60;

/// The UDP answer size past which the upstream truncates (RFC 1035's 512 bytes).
pub const UDP_LIMIT: usize = 512;

/// A running test upstream.
pub struct Upstream {
    /// Where it listens (UDP and TCP).
    pub addr: SocketAddr,
    udp_queries: Arc<AtomicUsize>,
    tcp_queries: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

type Zone = Arc<HashMap<Name, Vec<Ipv4Addr>>>;

fn answer(zone: &Zone, query: &Message) -> Message {
    let mut m = Message::response(query.metadata.id, query.metadata.op_code);
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    let Some(q) = query.queries.first() else {
        m.metadata.response_code = ResponseCode::FormErr;
        return m;
    };
    m.add_query(q.clone());
    let name = q.name().to_lowercase();
    match zone.get(&name) {
        Some(ips) => {
            if q.query_type() == RecordType::A {
                for ip in ips {
                    m.add_answer(Record::from_rdata(
                        q.name().clone(),
                        UPSTREAM_TTL,
                        RData::A(A(*ip)),
                    ));
                }
            }
        }
        None => {
            m.metadata.response_code = ResponseCode::NXDomain;
            let origin = Name::root();
            m.add_authority(Record::from_rdata(
                origin.clone(),
                UPSTREAM_TTL,
                RData::SOA(SOA::new(
                    origin.clone(),
                    origin,
                    1,
                    1800,
                    900,
                    604_800,
                    UPSTREAM_TTL,
                )),
            ));
        }
    }
    m
}

impl Upstream {
    /// Serves `names` (each with its addresses) on `127.0.0.1` on a free port.
    pub async fn start(names: &[(&str, Vec<Ipv4Addr>)]) -> anyhow::Result<Upstream> {
        let zone: Zone = Arc::new(
            names
                .iter()
                .map(|(n, ips)| Ok((Name::from_ascii(n)?.to_lowercase(), ips.clone())))
                .collect::<anyhow::Result<_>>()?,
        );
        let udp = UdpSocket::bind("127.0.0.1:0").await?;
        let addr = udp.local_addr()?;
        let tcp = TcpListener::bind(addr).await?;
        let stop = CancellationToken::new();
        let udp_queries = Arc::new(AtomicUsize::new(0));
        let tcp_queries = Arc::new(AtomicUsize::new(0));
        {
            let (zone, stop, count) = (zone.clone(), stop.clone(), udp_queries.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; u16::MAX as usize];
                loop {
                    let (n, from) = tokio::select! {
                        () = stop.cancelled() => return,
                        r = udp.recv_from(&mut buf) => match r { Ok(r) => r, Err(_) => return },
                    };
                    let Some(Ok(query)) = buf.get(..n).map(Message::from_vec) else {
                        continue;
                    };
                    if query.metadata.message_type != MessageType::Query {
                        continue;
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let mut response = answer(&zone, &query);
                    let Ok(mut bytes) = response.to_vec() else {
                        continue;
                    };
                    if bytes.len() > UDP_LIMIT {
                        response = response.truncate();
                        let Ok(b) = response.to_vec() else { continue };
                        bytes = b;
                    }
                    let _ = udp.send_to(&bytes, from).await;
                }
            });
        }
        {
            let (zone, stop, count) = (zone, stop.clone(), tcp_queries.clone());
            tokio::spawn(async move {
                loop {
                    let (mut conn, _) = tokio::select! {
                        () = stop.cancelled() => return,
                        r = tcp.accept() => match r { Ok(r) => r, Err(_) => return },
                    };
                    let (zone, count) = (zone.clone(), count.clone());
                    tokio::spawn(async move {
                        let mut len = [0u8; 2];
                        while conn.read_exact(&mut len).await.is_ok() {
                            let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
                            if conn.read_exact(&mut buf).await.is_err() {
                                return;
                            }
                            let Ok(query) = Message::from_vec(&buf) else {
                                return;
                            };
                            count.fetch_add(1, Ordering::SeqCst);
                            let Ok(bytes) = answer(&zone, &query).to_vec() else {
                                return;
                            };
                            let Ok(n) = u16::try_from(bytes.len()) else {
                                return;
                            };
                            if conn.write_all(&n.to_be_bytes()).await.is_err()
                                || conn.write_all(&bytes).await.is_err()
                            {
                                return;
                            }
                        }
                    });
                }
            });
        }
        Ok(Upstream {
            addr,
            udp_queries,
            tcp_queries,
            stop,
        })
    }

    /// Questions received over UDP so far.
    pub fn udp_queries(&self) -> usize {
        self.udp_queries.load(Ordering::SeqCst)
    }

    /// Questions received over TCP so far.
    pub fn tcp_queries(&self) -> usize {
        self.tcp_queries.load(Ordering::SeqCst)
    }
}
