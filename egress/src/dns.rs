//! DNS for sandboxes: the stub every sandbox's lookups reach, and the upstream
//! resolver the stub and the proxy ask.
//!
//! The stub answers only names the allowlist admits, with their IPv4 addresses as
//! the upstream resolver gives them, minus those in special ranges no address rule
//! covers; every other name is NXDOMAIN. AAAA and every other type are answered
//! empty (the sandbox has no IPv6 route, so clients go straight to IPv4). Every
//! address handed out is remembered ([`AddrBook`]), and admitted by the namespace's
//! firewall before the answer leaves: the transparent path admits connections only
//! to those (and to the allowlist's address ranges), and the firewall refuses every
//! other connection at connect.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use paddock_core::egress::{normalize_name, EgressRules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most bytes of a DNS message over UDP that the stub reads or sends.
pub const MAX_UDP: usize = 1232;
/// The longest TTL the stub gives out, in seconds.
const MAX_TTL: u32 = 300;
/// How long an address handed out stays admitted on the transparent path after its
/// last answer, at least (clients cache past the TTL).
pub(crate) const BOOK_KEEP: Duration = Duration::from_secs(600);
/// The most addresses one sandbox's book holds.
pub(crate) const BOOK_MAX: usize = 4096;

/// The resolvers the gateway asks, in order.
#[derive(Debug, Clone)]
pub struct Upstream {
    servers: Vec<SocketAddr>,
    timeout: Duration,
}

/// What the upstream resolver said about a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// Its IPv4 addresses, with the smallest TTL among them.
    Addrs(Vec<Ipv4Addr>, u32),
    /// It does not exist (NXDOMAIN), or has no IPv4 address.
    NoSuchName,
}

impl Upstream {
    /// Resolvers `servers`, each asked for at most `timeout`.
    pub fn new(servers: Vec<SocketAddr>, timeout: Duration) -> Upstream {
        Upstream { servers, timeout }
    }

    /// The `nameserver` lines of `/etc/resolv.conf` (port 53), or none when it cannot
    /// be read.
    pub fn system_servers() -> Vec<SocketAddr> {
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        parse_resolv_conf(&text)
    }

    /// The servers asked.
    pub fn servers(&self) -> &[SocketAddr] {
        &self.servers
    }

    /// The IPv4 addresses of `name` (already checked by [`normalize_name`]).
    pub async fn resolve(&self, name: &str) -> io::Result<Resolved> {
        let qname = Name::from_ascii(format!("{name}."))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no resolver is configured");
        for server in &self.servers {
            match tokio::time::timeout(self.timeout, ask(*server, &qname)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => last = e,
                Err(_) => {
                    last = io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("resolver {server} did not answer within {:?}", self.timeout),
                    )
                }
            }
        }
        Err(last)
    }
}

/// The nameservers of a `resolv.conf`.
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|a| a.split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// One question to one server: UDP, then TCP when the answer was truncated.
async fn ask(server: SocketAddr, qname: &Name) -> io::Result<Resolved> {
    let mut query = Message::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(qname.clone(), RecordType::A));
    let id = query.metadata.id;
    let bytes = query
        .to_vec()
        .map_err(|e| io::Error::other(e.to_string()))?;
    let bind: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = tokio::net::UdpSocket::bind(bind).await?;
    sock.connect(server).await?;
    sock.send(&bytes).await?;
    let mut buf = vec![0u8; 4096];
    let answer = loop {
        let n = sock.recv(&mut buf).await?;
        match Message::from_vec(&buf[..n]) {
            Ok(m) if m.metadata.id == id && m.metadata.message_type == MessageType::Response => {
                break m
            }
            _ => continue,
        }
    };
    let answer = if answer.metadata.truncation {
        ask_tcp(server, &bytes, id).await?
    } else {
        answer
    };
    Ok(read_answer(&answer))
}

async fn ask_tcp(server: SocketAddr, query: &[u8], id: u16) -> io::Result<Message> {
    let mut s = tokio::net::TcpStream::connect(server).await?;
    let mut framed = (query.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(query);
    s.write_all(&framed).await?;
    let len = s.read_u16().await?;
    let mut buf = vec![0u8; usize::from(len)];
    s.read_exact(&mut buf).await?;
    let m = Message::from_vec(&buf).map_err(|e| io::Error::other(e.to_string()))?;
    if m.metadata.id != id {
        return Err(io::Error::other("the resolver answered another question"));
    }
    Ok(m)
}

fn read_answer(m: &Message) -> Resolved {
    if m.metadata.response_code != ResponseCode::NoError {
        return Resolved::NoSuchName;
    }
    let mut addrs = Vec::new();
    let mut ttl = MAX_TTL;
    for r in &m.answers {
        if let RData::A(a) = &r.data {
            if !addrs.contains(&a.0) {
                addrs.push(a.0);
            }
            ttl = ttl.min(r.ttl);
        }
    }
    if addrs.is_empty() {
        Resolved::NoSuchName
    } else {
        Resolved::Addrs(addrs, ttl)
    }
}

/// The addresses a sandbox's stub handed out, and for which name.
#[derive(Debug, Default)]
pub struct AddrBook {
    entries: HashMap<IpAddr, (String, Instant)>,
}

/// What [`AddrBook::note`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Noted {
    /// Whether the address was held (and not expired) already: its time restarts.
    pub renewed: bool,
    /// The live address let go to make room, if the book was full of them.
    pub evicted: Option<IpAddr>,
}

impl AddrBook {
    /// Remembers that `addr` was handed out for `name`, for ten minutes from now.
    pub fn note(&mut self, addr: IpAddr, name: &str) -> Noted {
        let now = Instant::now();
        let mut noted = Noted {
            renewed: self.name_of(addr).is_some(),
            evicted: None,
        };
        if self.entries.len() >= BOOK_MAX && !self.entries.contains_key(&addr) {
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= BOOK_MAX {
                // Still full of live entries: the one that expires first goes.
                if let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(a, _)| *a)
                {
                    self.entries.remove(&oldest);
                    noted.evicted = Some(oldest);
                }
            }
        }
        self.entries
            .insert(addr, (name.to_string(), now + BOOK_KEEP));
        noted
    }

    /// The name `addr` was handed out for, if it still is.
    pub fn name_of(&self, addr: IpAddr) -> Option<&str> {
        self.entries
            .get(&addr)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(n, _)| n.as_str())
    }
}

/// What the stub decided about one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// An answer to send, and what to record: the name asked, whether it was
    /// allowed, the first address given, and why.
    Answer {
        /// The message to send back.
        reply: Vec<u8>,
        /// The name asked (lower case), if the question had one.
        name: Option<String>,
        /// Whether the allowlist admitted the name.
        allowed: bool,
        /// The addresses handed out.
        addrs: Vec<Ipv4Addr>,
        /// The rule that admitted it, or why not.
        reason: String,
    },
    /// Nothing to answer (not a DNS query at all).
    Drop,
}

/// Answers one DNS message `query` from a sandbox under `rules`, asking `upstream`
/// for admitted names. Never panics on any bytes.
pub async fn answer(query: &[u8], rules: &EgressRules, upstream: &Upstream) -> Decision {
    let Ok(msg) = Message::from_vec(query) else {
        // An id is there: say the message was malformed.
        if query.len() >= 12 {
            let id = u16::from_be_bytes([query[0], query[1]]);
            return refuse(
                &Message::error_msg(id, OpCode::Query, ResponseCode::FormErr),
                None,
                "a malformed DNS message",
            );
        }
        return Decision::Drop;
    };
    if msg.metadata.message_type != MessageType::Query {
        return Decision::Drop;
    }
    let id = msg.metadata.id;
    if msg.metadata.op_code != OpCode::Query {
        return refuse(
            &Message::error_msg(id, msg.metadata.op_code, ResponseCode::NotImp),
            None,
            "not a standard query",
        );
    }
    let [q] = msg.queries.as_slice() else {
        return refuse(
            &Message::error_msg(id, OpCode::Query, ResponseCode::FormErr),
            None,
            "not exactly one question",
        );
    };
    let mut reply = Message::response(id, OpCode::Query);
    reply.metadata.recursion_desired = msg.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.add_query(q.clone());
    let asked = q.name().to_ascii();
    let Some(name) = normalize_name(&asked) else {
        reply.metadata.response_code = ResponseCode::NXDomain;
        return refuse(&reply, Some(asked.to_ascii_lowercase()), "not a host name");
    };
    let rule = if q.query_class() != DNSClass::IN {
        None
    } else {
        rules.rule_for_name(&name)
    };
    let Some(rule) = rule.map(|r| r.to_string()) else {
        reply.metadata.response_code = ResponseCode::NXDomain;
        return refuse(&reply, Some(name), "matches no rule of the allowlist");
    };
    if q.query_type() != RecordType::A {
        // AAAA and the rest: an empty answer (the name exists; nothing of that type).
        return Decision::Answer {
            reply: encode(&reply),
            name: Some(name),
            allowed: true,
            addrs: Vec::new(),
            reason: format!("{rule} (no {} records are given)", q.query_type()),
        };
    }
    // An address literal is its own answer (under an address rule).
    let resolved = match paddock_core::egress::parse_addr(&name) {
        Some(IpAddr::V4(a)) => Ok(Resolved::Addrs(vec![a], MAX_TTL)),
        _ => upstream.resolve(&name).await,
    };
    match resolved {
        Ok(Resolved::Addrs(addrs, ttl)) => {
            let mut given = Vec::new();
            let mut refused: Option<String> = None;
            for a in addrs {
                match crate::proxy::refusal(rules, IpAddr::V4(a)) {
                    None => given.push(a),
                    Some(why) => refused = Some(why),
                }
            }
            if given.is_empty() {
                let why = refused.unwrap_or_else(|| "no address".to_string());
                return Decision::Answer {
                    reply: encode(&reply),
                    name: Some(name),
                    allowed: false,
                    addrs: Vec::new(),
                    reason: format!("resolves only to refused addresses ({why})"),
                };
            }
            for a in &given {
                reply.add_answer(Record::from_rdata(
                    q.name().clone(),
                    ttl.min(MAX_TTL),
                    RData::A((*a).into()),
                ));
            }
            Decision::Answer {
                reply: encode(&reply),
                name: Some(name),
                allowed: true,
                addrs: given,
                reason: rule,
            }
        }
        Ok(Resolved::NoSuchName) => {
            reply.metadata.response_code = ResponseCode::NXDomain;
            Decision::Answer {
                reply: encode(&reply),
                name: Some(name),
                allowed: true,
                addrs: Vec::new(),
                reason: format!("{rule} (the upstream resolver knows no address)"),
            }
        }
        Err(e) => {
            reply.metadata.response_code = ResponseCode::ServFail;
            Decision::Answer {
                reply: encode(&reply),
                name: Some(name),
                allowed: true,
                addrs: Vec::new(),
                reason: format!("{rule} (the upstream resolver failed: {e})"),
            }
        }
    }
}

fn encode(m: &Message) -> Vec<u8> {
    m.to_vec().unwrap_or_default()
}

fn refuse(m: &Message, name: Option<String>, why: &str) -> Decision {
    Decision::Answer {
        reply: encode(m),
        name,
        allowed: false,
        addrs: Vec::new(),
        reason: why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(hosts: &[&str]) -> EgressRules {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        EgressRules::compile("network.allowlist", &hosts, &[]).unwrap()
    }

    fn question(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    /// A resolver on loopback that knows `allowed.test`, `private.test` and
    /// `mixed.test`, and nothing else.
    async fn resolver() -> SocketAddr {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let (n, from) = sock.recv_from(&mut buf).await.unwrap();
                let q = Message::from_vec(&buf[..n]).unwrap();
                let mut r = Message::response(q.metadata.id, OpCode::Query);
                let query = q.queries[0].clone();
                let found: &[[u8; 4]] = match query.name().to_ascii().as_str() {
                    "allowed.test." => &[[198, 51, 100, 7]],
                    "private.test." => &[[10, 9, 8, 7]],
                    "mixed.test." => &[[10, 9, 8, 7], [198, 51, 100, 8]],
                    _ => &[],
                };
                if found.is_empty() {
                    r.metadata.response_code = ResponseCode::NXDomain;
                }
                for a in found {
                    r.add_answer(Record::from_rdata(
                        query.name().clone(),
                        30,
                        RData::A(Ipv4Addr::from(*a).into()),
                    ));
                }
                r.add_query(query);
                sock.send_to(&r.to_vec().unwrap(), from).await.unwrap();
            }
        });
        addr
    }

    fn parsed(d: &Decision) -> (Message, bool, String) {
        match d {
            Decision::Answer {
                reply,
                allowed,
                reason,
                ..
            } => (Message::from_vec(reply).unwrap(), *allowed, reason.clone()),
            Decision::Drop => panic!("dropped"),
        }
    }

    #[tokio::test]
    async fn only_admitted_names_resolve_and_special_addresses_are_dropped() {
        let up = Upstream::new(vec![resolver().await], Duration::from_secs(2));
        let r = rules(&["allowed.test", "private.test", "mixed.test", "*.wild.test"]);
        let d = answer(&question("Allowed.Test.", RecordType::A), &r, &up).await;
        let (m, allowed, reason) = parsed(&d);
        assert!(allowed);
        assert_eq!(reason, "allowed.test");
        assert_eq!(m.answers.len(), 1);
        assert_eq!(
            m.answers[0].data.ip_addr(),
            Some("198.51.100.7".parse().unwrap())
        );

        let (m, allowed, reason) =
            parsed(&answer(&question("denied.test.", RecordType::A), &r, &up).await);
        assert!(!allowed);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert!(reason.contains("no rule"), "{reason}");

        let (m, allowed, reason) =
            parsed(&answer(&question("private.test.", RecordType::A), &r, &up).await);
        assert!(!allowed, "{reason}");
        assert!(m.answers.is_empty());
        assert!(reason.contains("private"), "{reason}");

        let (m, allowed, _) =
            parsed(&answer(&question("mixed.test.", RecordType::A), &r, &up).await);
        assert!(allowed);
        assert_eq!(m.answers.len(), 1, "{m:?}");

        let (m, allowed, _) =
            parsed(&answer(&question("allowed.test.", RecordType::AAAA), &r, &up).await);
        assert!(allowed);
        assert!(m.answers.is_empty());
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);

        // Admitted but unknown upstream: NXDOMAIN, still allowed by the policy.
        let (m, allowed, _) =
            parsed(&answer(&question("x.wild.test.", RecordType::A), &r, &up).await);
        assert!(allowed);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    }

    #[tokio::test]
    async fn garbage_is_answered_or_dropped_never_a_panic() {
        let up = Upstream::new(vec![], Duration::from_millis(10));
        let r = rules(&["a.test"]);
        assert_eq!(answer(b"", &r, &up).await, Decision::Drop);
        let (m, allowed, _) =
            parsed(&answer(&[0x12, 0x34, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 1], &r, &up).await);
        assert!(!allowed);
        assert_eq!(m.metadata.id, 0x1234);
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        // A resolver that is not there: SERVFAIL for an admitted name.
        let (m, _, reason) = parsed(&answer(&question("a.test.", RecordType::A), &r, &up).await);
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail, "{reason}");
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as u8
                })
                .collect();
            let _ = answer(&bytes, &r, &up).await;
        }
    }

    #[test]
    fn resolv_conf_and_the_book() {
        let s = parse_resolv_conf(
            "# x\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\nsearch a\nnameserver bogus\n",
        );
        assert_eq!(
            s,
            vec![
                "10.255.255.53:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
        let mut b = AddrBook::default();
        let a: IpAddr = "198.51.100.7".parse().unwrap();
        assert_eq!(b.note(a, "allowed.test"), Noted::default());
        assert_eq!(b.name_of(a), Some("allowed.test"));
        assert!(b.note(a, "allowed.test").renewed);
        let mut evicted = 0;
        for i in 0..(BOOK_MAX as u32 + 10) {
            let n = b.note(IpAddr::V4(Ipv4Addr::from(i)), "x.test");
            evicted += usize::from(n.evicted.is_some());
        }
        assert!(b.entries.len() <= BOOK_MAX);
        assert_eq!(evicted, 11, "each note past the bound lets one address go");
    }
}
