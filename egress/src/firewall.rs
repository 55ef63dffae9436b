//! The firewall of a sandbox's namespace. It refuses at connect (a TCP reset, so
//! `ECONNREFUSED` at once) every connection the gateway would refuse by its
//! destination alone, and passes the others to the transparent path, which still
//! reads their TLS server name or HTTP `Host` before it dials.
//!
//! - [`ruleset`]: the `nftables` rules, loaded when the namespace is made. Under an
//!   allowlist a connection passes when its port is listed and its address is one
//!   the DNS stub handed out for an admitted name (the set `given`) or one an address
//!   rule covers (the set `ranges`), and is not an address of the host (`own`).
//!   Under `unrestricted` it passes unless its address lies in a range the rules keep
//!   closed (`closed`) or is the host's.
//! - [`Firewall::admit`]: adds the addresses the stub hands out to `given`, over
//!   `nf_tables` netlink, before the answer leaves the stub. Each stays for
//!   [`crate::dns::BOOK_KEEP`] after its last answer, as in the stub's book; the
//!   set holds at most [`GIVEN_MAX`].
//! - [`Firewall::read_log`]: the connections refused, as the rules log them to an
//!   `nfnetlink_log` group of the namespace, so that the gateway records each one as
//!   it records any denial. The kernel queues each to the gateway's socket before
//!   the refused `connect` returns.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use paddock_core::egress::{EgressRules, HostRule};
use parking_lot::Mutex;

use crate::netlink::{attributes, messages, Message};
use crate::{sys, Ports};

/// The `nfnetlink_log` group the rules log refused connections to (groups are per
/// namespace).
const LOG_GROUP: u16 = 1;
/// The bytes of a refused packet the log copies: an IPv4 header with options and the
/// start of the TCP header.
const LOG_COPY: u32 = 80;
/// The receive buffer of the log's socket.
const LOG_BUFFER: usize = 1 << 20;
/// The most addresses the set `given` holds: twice the stub's book, since the kernel
/// counts an expired element until it collects it.
pub(crate) const GIVEN_MAX: usize = 2 * crate::dns::BOOK_MAX;
/// How long an exchange with the kernel over the set may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(1);

const TABLE: &[u8] = b"paddock\0";
const GIVEN: &[u8] = b"given\0";

// `linux/netfilter/nf_tables.h`, which the `libc` crate does not carry.
const NFPROTO_INET: u8 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
const NFTA_DATA_VALUE: u16 = 1;

/// The IPv4 prefixes of [`paddock_core::egress::SpecialRange`]; a test checks them
/// against `SpecialRange::of`.
const SPECIAL_V4: [(Ipv4Addr, u8); 10] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(224, 0, 0, 0), 4),
    (Ipv4Addr::new(240, 0, 0, 0), 4),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
];

/// The host's own IPv4 addresses but loopback (which, in the namespace, is the
/// namespace's own): what the set `own` refuses. Read in the host's namespace.
pub(crate) fn own_v4() -> Vec<Ipv4Addr> {
    let mut own: Vec<Ipv4Addr> = crate::host::own_addresses()
        .iter()
        .filter_map(|a| match a {
            IpAddr::V4(v4) if !v4.is_loopback() => Some(*v4),
            _ => None,
        })
        .collect();
    own.sort_unstable();
    own
}

/// The namespace's rules for `rules`: DNS to the stub; TCP refused at connect (and
/// logged) where the gateway would refuse it by its destination, else redirected to
/// the transparent path; loopback, the redirected connections and the refusals'
/// resets passed; everything else dropped (so that it fails at once, with `EPERM`).
/// `own`: the host's addresses ([`own_v4`]).
pub(crate) fn ruleset(rules: &EgressRules, ports: Ports, own: &[Ipv4Addr]) -> String {
    let elements = |items: Vec<String>| {
        if items.is_empty() {
            String::new()
        } else {
            format!(" elements = {{ {} }};", items.join(", "))
        }
    };
    let (sets, admitted) = if rules.is_unrestricted() {
        let closed = SPECIAL_V4
            .iter()
            .filter(|(net, _)| rules.check_resolved(IpAddr::V4(*net)).is_err())
            .map(|(net, prefix)| format!("{net}/{prefix}"))
            .collect();
        (
            format!(
                "  set closed {{ type ipv4_addr; flags interval; auto-merge;{} }}\n",
                elements(closed)
            ),
            "    ip daddr @closed goto refuse\n".to_string(),
        )
    } else {
        let ranges = rules
            .hosts()
            .iter()
            .filter_map(|h| match h {
                HostRule::Range {
                    net: IpAddr::V4(net),
                    prefix,
                } => Some(format!("{net}/{prefix}")),
                _ => None,
            })
            .collect();
        let ports: Vec<String> = rules.ports().iter().map(u16::to_string).collect();
        (
            format!(
                "  set given {{ type ipv4_addr; flags timeout; size {GIVEN_MAX}; }}\n  set ranges {{ type ipv4_addr; flags interval; auto-merge;{} }}\n",
                elements(ranges)
            ),
            format!(
                "    tcp dport != {{ {} }} goto refuse\n    ip daddr @given accept\n    ip daddr @ranges accept\n    goto refuse\n",
                ports.join(", ")
            ),
        )
    };
    let own = elements(own.iter().map(Ipv4Addr::to_string).collect());
    format!(
        "table inet paddock {{
{sets}  set own {{ type ipv4_addr;{own} }}
  chain gate {{
    type filter hook output priority -150; policy accept;
    meta nfproto ipv6 accept
    ip daddr 127.0.0.0/8 accept
    meta l4proto != tcp accept
    ct state established,related accept
    tcp dport {dns} accept
    ip daddr @own goto refuse
{admitted}  }}
  chain refuse {{
    tcp flags & (syn | ack) == syn log group {LOG_GROUP} snaplen {LOG_COPY} queue-threshold 1
    reject with tcp reset
  }}
  chain nat_out {{
    type nat hook output priority -100; policy accept;
    meta l4proto {{ tcp, udp }} th dport {dns} redirect to :{dns}
    ip daddr != 127.0.0.0/8 meta l4proto tcp ct state new redirect to :{transparent}
  }}
  chain out {{
    type filter hook output priority 0; policy drop;
    ip daddr 127.0.0.0/8 accept
    ip6 daddr ::1 accept
    ct status dnat accept
    ip daddr {source} accept
  }}
}}
",
        dns = ports.dns,
        transparent = ports.transparent,
        source = sys::SOURCE_ADDR,
    )
}

/// What the firewall's log said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Logged {
    /// A connection to this destination was refused.
    Refused(SocketAddrV4),
    /// This many refusals were not delivered (the socket's buffer was full).
    Lost(u32),
}

/// One namespace's firewall, as the gateway drives it: its set of handed-out
/// addresses and its log of refusals, each over a netlink socket made in the
/// namespace.
#[derive(Debug)]
pub(crate) struct Firewall {
    control: Mutex<Control>,
    log: Mutex<Log>,
}

#[derive(Debug)]
struct Control {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct Log {
    fd: OwnedFd,
    /// The log's sequence number expected next: a jump counts lost messages.
    next: Option<u32>,
    buf: Vec<u8>,
}

impl Firewall {
    /// Takes the namespace's two netlink sockets ([`sys::Namespace`]), and binds the
    /// second to the rules' log group.
    pub(crate) fn new(control: OwnedFd, log: OwnedFd) -> io::Result<Firewall> {
        sys::set_recv_timeout(&control, CONTROL_TIMEOUT)?;
        sys::set_recv_timeout(&log, CONTROL_TIMEOUT)?;
        sys::set_recv_buffer(&log, LOG_BUFFER)?;
        let mut log = Log {
            fd: log,
            next: None,
            buf: vec![0; 16 << 10],
        };
        bind_log(&mut log).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("binding the firewall's log (nfnetlink_log group {LOG_GROUP}): {e}"),
            )
        })?;
        Ok(Firewall {
            control: Mutex::new(Control {
                fd: control,
                seq: 0,
                buf: vec![0; 16 << 10],
            }),
            log: Mutex::new(log),
        })
    }

    /// Admits `addrs` at connect for `keep` from now, in one transaction that first
    /// takes out `held`: those of `addrs` the set may hold already (put back, so that
    /// their time starts again on any kernel), and those the stub's book let go.
    pub(crate) fn admit(
        &self,
        addrs: &[Ipv4Addr],
        held: &[Ipv4Addr],
        keep: Duration,
    ) -> io::Result<()> {
        let mut c = self.control.lock();
        match c.apply(held, addrs, keep) {
            // One of `held` had gone already (its time ran out): add, take nothing out.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !held.is_empty() => {
                c.apply(&[], addrs, keep)
            }
            other => other,
        }
    }

    /// Reads what the log holds, without waiting, and gives each entry to `each`;
    /// ends with `WouldBlock` once it is empty.
    pub(crate) fn read_log(&self, mut each: impl FnMut(Logged)) -> io::Result<()> {
        let mut log = self.log.lock();
        let Log { fd, next, buf } = &mut *log;
        loop {
            let n = match sys::netlink_recv(fd.as_raw_fd(), buf, true) {
                Ok(n) => n.min(buf.len()),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Counted by the sequence numbers of the next ones.
                    tracing::warn!("the firewall's log overflowed; refusals were lost");
                    continue;
                }
                Err(e) => return Err(e),
            };
            read_logged(&buf[..n], next, &mut each);
        }
    }

    /// A second descriptor of the log's socket, for a reactor to watch.
    pub(crate) fn log_fd(&self) -> io::Result<OwnedFd> {
        self.log.lock().fd.try_clone()
    }
}

/// The entries of one datagram of the log; `next` is the sequence number expected
/// next, and a jump past it counts the messages the kernel could not deliver.
fn read_logged(datagram: &[u8], next: &mut Option<u32>, each: &mut impl FnMut(Logged)) {
    for (kind, _, payload) in messages(datagram) {
        if kind != ulog(libc::NFULNL_MSG_PACKET) {
            continue;
        }
        let (mut seq, mut dst) = (None, None);
        for (attr, data) in attributes(payload) {
            match i32::from(attr) {
                libc::NFULA_SEQ => {
                    seq = data
                        .get(..4)
                        .map(|b| u32::from_be_bytes(b.try_into().expect("four bytes")))
                }
                libc::NFULA_PAYLOAD => dst = tcp_destination(data),
                _ => {}
            }
        }
        if let Some(seq) = seq {
            if let Some(expected) = *next {
                let gap = seq.wrapping_sub(expected);
                if gap != 0 && gap < 1 << 31 {
                    each(Logged::Lost(gap));
                }
            }
            *next = Some(seq.wrapping_add(1));
        }
        if let Some(dst) = dst {
            each(Logged::Refused(dst));
        }
    }
}

impl Control {
    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// One transaction on the set `given`: `remove`, then `add` with timeout `keep`.
    fn apply(&mut self, remove: &[Ipv4Addr], add: &[Ipv4Addr], keep: Duration) -> io::Result<()> {
        let mut out = Vec::with_capacity(256);
        let begin = self.next_seq();
        Message::new(
            libc::NFNL_MSG_BATCH_BEGIN as u16,
            libc::NLM_F_REQUEST as u16,
            begin,
            libc::AF_UNSPEC as u8,
            libc::NFNL_SUBSYS_NFTABLES as u16,
        )
        .finish(&mut out);
        let mut acks = Vec::new();
        for (kind, addrs, timeout) in [
            (libc::NFT_MSG_DELSETELEM, remove, None),
            (libc::NFT_MSG_NEWSETELEM, add, Some(keep)),
        ] {
            if addrs.is_empty() {
                continue;
            }
            let seq = self.next_seq();
            let mut flags = libc::NLM_F_REQUEST | libc::NLM_F_ACK;
            if timeout.is_some() {
                flags |= libc::NLM_F_CREATE;
            }
            let mut m = Message::new(nftables(kind), flags as u16, seq, NFPROTO_INET, 0);
            m.attr(NFTA_SET_ELEM_LIST_TABLE, TABLE);
            m.attr(NFTA_SET_ELEM_LIST_SET, GIVEN);
            m.nest(NFTA_SET_ELEM_LIST_ELEMENTS);
            for a in addrs {
                m.nest(NFTA_LIST_ELEM);
                m.nest(NFTA_SET_ELEM_KEY);
                m.attr(NFTA_DATA_VALUE, &a.octets());
                m.end();
                if let Some(t) = timeout {
                    let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
                    m.attr(NFTA_SET_ELEM_TIMEOUT, &ms.to_be_bytes());
                }
                m.end();
            }
            m.end();
            m.finish(&mut out);
            acks.push(seq);
        }
        if acks.is_empty() {
            return Ok(());
        }
        let end = self.next_seq();
        Message::new(
            libc::NFNL_MSG_BATCH_END as u16,
            libc::NLM_F_REQUEST as u16,
            end,
            libc::AF_UNSPEC as u8,
            libc::NFNL_SUBSYS_NFTABLES as u16,
        )
        .finish(&mut out);
        sys::netlink_send(self.fd.as_raw_fd(), &out)?;
        await_acks(&self.fd, &mut self.buf, begin, acks)
    }
}

/// Binds `log` to [`LOG_GROUP`]: packets copied ([`LOG_COPY`] bytes), each sent at
/// once, with sequence numbers.
fn bind_log(log: &mut Log) -> io::Result<()> {
    let mut out = Vec::with_capacity(64);
    let mut m = Message::new(
        ulog(libc::NFULNL_MSG_CONFIG),
        (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16,
        1,
        libc::AF_UNSPEC as u8,
        LOG_GROUP,
    );
    m.attr(
        libc::NFULA_CFG_CMD as u16,
        &[libc::NFULNL_CFG_CMD_BIND as u8],
    );
    // struct nfulnl_msg_config_mode: copy_range (big-endian), copy_mode, padding.
    let mut mode = LOG_COPY.to_be_bytes().to_vec();
    mode.extend_from_slice(&[libc::NFULNL_COPY_PACKET as u8, 0]);
    m.attr(libc::NFULA_CFG_MODE as u16, &mode);
    m.attr(libc::NFULA_CFG_QTHRESH as u16, &1u32.to_be_bytes());
    m.attr(
        libc::NFULA_CFG_FLAGS as u16,
        &(libc::NFULNL_CFG_F_SEQ as u16).to_be_bytes(),
    );
    m.finish(&mut out);
    sys::netlink_send(log.fd.as_raw_fd(), &out)?;
    await_acks(&log.fd, &mut log.buf, 0, vec![1])
}

/// Waits for the kernel's answers to the messages numbered `acks`; the first error
/// among them. An error about message `batch` (the batch as a whole) ends the wait.
fn await_acks(fd: &OwnedFd, buf: &mut [u8], batch: u32, mut acks: Vec<u32>) -> io::Result<()> {
    let mut failed = None;
    while !acks.is_empty() {
        let n = match sys::netlink_recv(fd.as_raw_fd(), buf, false) {
            Ok(n) => n.min(buf.len()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel did not answer the firewall's netlink request",
                ))
            }
            Err(e) => return Err(e),
        };
        for (kind, seq, payload) in messages(&buf[..n]) {
            if kind != libc::NLMSG_ERROR as u16 || payload.len() < 4 {
                continue;
            }
            let code = i32::from_ne_bytes(payload[..4].try_into().expect("four bytes"));
            if code != 0 && batch != 0 && seq == batch {
                return Err(io::Error::from_raw_os_error(-code));
            }
            if let Some(i) = acks.iter().position(|s| *s == seq) {
                acks.swap_remove(i);
                if code != 0 && failed.is_none() {
                    failed = Some(io::Error::from_raw_os_error(-code));
                }
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

fn nftables(kind: libc::c_int) -> u16 {
    ((libc::NFNL_SUBSYS_NFTABLES << 8) | kind) as u16
}

fn ulog(kind: libc::c_int) -> u16 {
    ((libc::NFNL_SUBSYS_ULOG << 8) | kind) as u16
}

/// The destination of an IPv4 TCP packet that starts `packet`.
fn tcp_destination(packet: &[u8]) -> Option<SocketAddrV4> {
    let first = *packet.first()?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < 20 || *packet.get(9)? != libc::IPPROTO_TCP as u8 {
        return None;
    }
    let dst: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
    let port: [u8; 2] = packet.get(ihl + 2..ihl + 4)?.try_into().ok()?;
    Some(SocketAddrV4::new(
        Ipv4Addr::from(dst),
        u16::from_be_bytes(port),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::egress::SpecialRange;

    fn covered(a: Ipv4Addr) -> Option<SpecialRange> {
        SPECIAL_V4.iter().find_map(|(net, prefix)| {
            let mask = u32::MAX << (32 - u32::from(*prefix));
            (u32::from(a) & mask == u32::from(*net))
                .then(|| SpecialRange::of(IpAddr::V4(*net)).expect("a special range"))
        })
    }

    #[test]
    fn the_special_prefixes_are_those_of_the_rules() {
        for (net, prefix) in SPECIAL_V4 {
            let last = Ipv4Addr::from(u32::from(net) | (u32::MAX >> prefix));
            let range = SpecialRange::of(IpAddr::V4(net));
            assert!(range.is_some(), "{net}/{prefix}");
            assert_eq!(SpecialRange::of(IpAddr::V4(last)), range, "{last}");
        }
        let mut x = 0x9e37_79b9_u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let a = Ipv4Addr::from(x);
            assert_eq!(covered(a), SpecialRange::of(IpAddr::V4(a)), "{a}");
        }
    }

    #[test]
    fn the_rules_name_the_allowlists_ports_ranges_and_the_hosts_addresses() {
        let hosts: Vec<String> = ["a.test", "198.51.100.0/24", "203.0.113.7", "2001:db8::/32"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let rules = EgressRules::compile("network.allowlist", &hosts, &[443, 8443]).unwrap();
        let own = [Ipv4Addr::new(198, 51, 100, 1)];
        let text = ruleset(&rules, crate::PORTS, &own);
        assert!(
            text.contains("tcp dport != { 443, 8443 } goto refuse"),
            "{text}"
        );
        assert!(
            text.contains("elements = { 198.51.100.0/24, 203.0.113.7/32 }"),
            "{text}"
        );
        assert!(text.contains("set own { type ipv4_addr; elements = { 198.51.100.1 }; }"));
        assert!(text.contains(&format!("size {GIVEN_MAX}")));
        assert!(!text.contains("@closed"));

        let text = ruleset(&EgressRules::unrestricted(false), crate::PORTS, &[]);
        assert!(
            text.contains("10.0.0.0/8") && text.contains("169.254.0.0/16"),
            "{text}"
        );
        assert!(
            !text.contains("@given") && !text.contains("dport !="),
            "{text}"
        );
        assert!(text.contains("set own { type ipv4_addr; }"), "{text}");
        let text = ruleset(&EgressRules::unrestricted(true), crate::PORTS, &[]);
        assert!(!text.contains("10.0.0.0/8") && text.contains("169.254.0.0/16"));
    }

    fn logged(seq: u32, to: [u8; 4], port: u16) -> Vec<u8> {
        let mut packet = vec![0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0, 192, 0, 0, 8];
        packet.extend_from_slice(&to);
        packet.extend_from_slice(&[0xc3, 0x50]);
        packet.extend_from_slice(&port.to_be_bytes());
        let mut out = Vec::new();
        let mut m = Message::new(ulog(libc::NFULNL_MSG_PACKET), 0, 0, 2, LOG_GROUP);
        m.attr(libc::NFULA_PREFIX as u16, b"\0");
        m.attr(libc::NFULA_PAYLOAD as u16, &packet);
        m.attr(libc::NFULA_SEQ as u16, &seq.to_be_bytes());
        m.finish(&mut out);
        out
    }

    #[test]
    fn the_log_gives_each_refusal_and_counts_what_it_lost() {
        let mut next = None;
        let mut got = Vec::new();
        let mut datagram = logged(0, [198, 51, 100, 3], 8081);
        datagram.extend(logged(1, [203, 0, 113, 9], 443));
        read_logged(&datagram, &mut next, &mut |l| got.push(l));
        read_logged(&logged(5, [203, 0, 113, 9], 80), &mut next, &mut |l| {
            got.push(l)
        });
        assert_eq!(
            got,
            [
                Logged::Refused("198.51.100.3:8081".parse().unwrap()),
                Logged::Refused("203.0.113.9:443".parse().unwrap()),
                Logged::Lost(3),
                Logged::Refused("203.0.113.9:80".parse().unwrap()),
            ]
        );
        assert_eq!(next, Some(6));
        // Other messages, and garbage, give nothing.
        got.clear();
        read_logged(&[0xff; 40], &mut next, &mut |l| got.push(l));
        assert!(got.is_empty());
    }

    /// The set and the log in a real namespace (root and `nft` needed; skipped
    /// otherwise): an address taken is admitted, renewed, kept when an address to let
    /// go had gone already; another is refused at connect, and the log names it.
    #[test]
    fn the_set_admits_what_it_is_given_and_the_log_names_what_was_refused() {
        use std::os::fd::AsFd;
        let Some(nft) = crate::find_nft() else {
            eprintln!("skipped: no nft");
            return;
        };
        let rules =
            EgressRules::compile("network.allowlist", &["a.test".to_string()], &[]).unwrap();
        let ns = match sys::make_namespace(&nft, &ruleset(&rules, crate::PORTS, &[]), crate::PORTS)
        {
            Ok(ns) => ns,
            Err(e) => {
                // Not root, or no network namespaces here.
                eprintln!("skipped: {e}");
                return;
            }
        };
        let fw = Firewall::new(ns.control, ns.log).expect("the firewall binds");
        let keep = Duration::from_secs(60);
        let (given, other, gone) = (
            Ipv4Addr::new(203, 0, 113, 1),
            Ipv4Addr::new(203, 0, 113, 2),
            Ipv4Addr::new(203, 0, 113, 3),
        );
        fw.admit(&[given], &[], keep).unwrap();
        fw.admit(&[given], &[given], keep).unwrap();
        fw.admit(&[given], &[gone], keep).unwrap();
        let netns = ns.netns.as_fd().try_clone_to_owned().unwrap();
        let (admitted, refused) = std::thread::spawn(move || {
            sys::enter_netns(netns.as_fd()).unwrap();
            let to = |a: Ipv4Addr| {
                std::net::TcpStream::connect_timeout(
                    &SocketAddrV4::new(a, 443).into(),
                    Duration::from_secs(2),
                )
                .map(drop)
                .map_err(|e| e.kind())
            };
            (to(given), to(other))
        })
        .join()
        .unwrap();
        // The transparent path's listener (nobody accepts here) completes the
        // handshake of the admitted one.
        assert_eq!(admitted, Ok(()));
        assert_eq!(refused, Err(io::ErrorKind::ConnectionRefused));
        let mut logged = Vec::new();
        let end = fw.read_log(|l| logged.push(l)).unwrap_err();
        assert_eq!(end.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(logged, [Logged::Refused(SocketAddrV4::new(other, 443))]);
        drop(ns.transparent);
    }

    #[test]
    fn a_logged_packet_names_its_destination() {
        let mut p = vec![0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0];
        p.extend_from_slice(&[192, 0, 0, 8, 198, 51, 100, 3]);
        p.extend_from_slice(&[0xc3, 0x50, 0x1f, 0x91]);
        assert_eq!(
            tcp_destination(&p),
            Some("198.51.100.3:8081".parse().unwrap())
        );
        assert_eq!(tcp_destination(&p[..22]), None);
        p[9] = 17;
        assert_eq!(tcp_destination(&p), None);
    }
}
