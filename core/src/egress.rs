//! Egress allowlists: which hosts and ports a sandbox under network policy
//! `allowlist` may reach, checked once at admission and then on every connection and
//! every DNS answer.
//!
//! A policy names hosts three ways: an exact name (`pypi.org`), a wildcard for the
//! names below one (`*.pythonhosted.org`: `files.pythonhosted.org` and
//! `a.b.pythonhosted.org`, not `pythonhosted.org` itself), and an address or range
//! (`198.51.100.7`, `10.0.0.0/8`). Ports default to 80 and 443.
//!
//! Two kinds of special addresses are kept apart:
//! - **closed** ranges (unspecified, loopback, link-local and so the cloud metadata
//!   address 169.254.169.254, multicast, reserved, and their IPv6 counterparts,
//!   IPv4 addresses embedded in IPv6 ones judged as themselves) are never reached,
//!   by any policy: an address rule that overlaps one is refused when the policy is
//!   compiled, and a name that resolves into one is refused when it is dialled (the
//!   classic server-side request forgery). `unrestricted` does not reach them
//!   either. The gateway adds the host's own addresses to them (see
//!   `paddock-egress`).
//! - **private** ranges (private and shared) are reached only through an address
//!   rule that covers them, or under `unrestricted` when the operator allows
//!   private ranges ([`EgressRules::unrestricted`]); whether a caller may write such
//!   a rule is the operator's choice (`allow_private`, checked at admission).
//!
//! Address entries are read in any notation a resolver library accepts for IPv4
//! (`2130706433`, `0x7f.1`, `0177.0.0.1`), so that no spelling slips past as a name.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The ports an allowlist admits when it names none.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];
/// The most host rules one policy may hold.
pub const MAX_HOSTS: usize = 256;
/// The most ports one policy may hold.
pub const MAX_PORTS: usize = 64;
/// The longest host name (RFC 1035, without the trailing dot).
pub const MAX_NAME_LEN: usize = 253;

/// One host rule of an allowlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRule {
    /// Exactly this name (lower case, no trailing dot).
    Exact(String),
    /// Every name below this one (stored with its leading dot: `.example.org`).
    Below(String),
    /// Every address in this range.
    Range {
        /// The range's first address (the host bits are zero).
        net: IpAddr,
        /// The prefix length.
        prefix: u8,
    },
    /// Every name (network `unrestricted` through the gateway: see
    /// [`EgressRules::unrestricted`]).
    Any,
}

/// The one rule of [`EgressRules::unrestricted`].
static ANY: HostRule = HostRule::Any;

impl HostRule {
    /// Whether this rule admits `name` (lower case, no trailing dot).
    fn admits_name(&self, name: &str) -> bool {
        match self {
            HostRule::Exact(n) => n == name,
            HostRule::Below(suffix) => name.len() > suffix.len() && name.ends_with(suffix.as_str()),
            HostRule::Range { .. } => false,
            HostRule::Any => true,
        }
    }

    /// Whether this rule covers `addr`.
    fn covers(&self, addr: IpAddr) -> bool {
        match *self {
            HostRule::Range { net, prefix } => in_range(addr, net, prefix),
            _ => false,
        }
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostRule::Exact(n) => f.write_str(n),
            HostRule::Below(s) => write!(f, "*{s}"),
            HostRule::Range { net, prefix } => write!(f, "{net}/{prefix}"),
            HostRule::Any => f.write_str("unrestricted"),
        }
    }
}

/// A checked allowlist: what [`crate::NetworkPolicy::Allowlist`] says, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRules {
    hosts: Vec<HostRule>,
    ports: Vec<u16>,
    /// Every name and port ([`EgressRules::unrestricted`]).
    any: bool,
    /// Under `any`: whether private and shared addresses are reached.
    private: bool,
}

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecialRange {
    /// 0.0.0.0/8, `::`.
    Unspecified,
    /// 127.0.0.0/8, `::1`.
    Loopback,
    /// 169.254.0.0/16 (the cloud metadata address among them), fe80::/10.
    LinkLocal,
    /// 10/8, 172.16/12, 192.168/16, fc00::/7.
    Private,
    /// 100.64.0.0/10 (carrier-grade NAT).
    Shared,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 192.0.0.0/24, 240.0.0.0/4 and the broadcast address.
    Reserved,
}

impl SpecialRange {
    /// A short name for messages and audit records.
    pub const fn as_str(self) -> &'static str {
        match self {
            SpecialRange::Unspecified => "unspecified",
            SpecialRange::Loopback => "loopback",
            SpecialRange::LinkLocal => "link-local",
            SpecialRange::Private => "private",
            SpecialRange::Shared => "shared",
            SpecialRange::Multicast => "multicast",
            SpecialRange::Reserved => "reserved",
        }
    }

    /// The special range `addr` lies in, if any. An IPv6 address that carries an
    /// IPv4 one (IPv4-mapped, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) is judged as
    /// that IPv4 address; the deprecated IPv4-compatible ones (`::a.b.c.d`) are
    /// reserved.
    pub fn of(addr: IpAddr) -> Option<SpecialRange> {
        match addr {
            IpAddr::V4(a) => special_v4(a),
            IpAddr::V6(a) => match embedded_v4(a) {
                Some(v4) => special_v4(v4),
                None => special_v6(a),
            },
        }
    }

    /// Whether no policy reaches this range (all but private and shared).
    pub const fn is_closed(self) -> bool {
        !matches!(self, SpecialRange::Private | SpecialRange::Shared)
    }
}

/// The IPv4 address an IPv6 address carries and is routed to: IPv4-mapped
/// (`::ffff:a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`).
fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = a.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = a.segments();
    let o = a.octets();
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

fn special_v4(a: Ipv4Addr) -> Option<SpecialRange> {
    let [o0, o1, o2, _] = a.octets();
    Some(match (o0, o1, o2) {
        (0, _, _) => SpecialRange::Unspecified,
        (127, _, _) => SpecialRange::Loopback,
        (169, 254, _) => SpecialRange::LinkLocal,
        (10, _, _) => SpecialRange::Private,
        (172, 16..=31, _) => SpecialRange::Private,
        (192, 168, _) => SpecialRange::Private,
        (100, 64..=127, _) => SpecialRange::Shared,
        (224..=239, _, _) => SpecialRange::Multicast,
        (240..=255, _, _) => SpecialRange::Reserved,
        (192, 0, 0) => SpecialRange::Reserved,
        _ => return None,
    })
}

fn special_v6(a: Ipv6Addr) -> Option<SpecialRange> {
    let s = a.segments();
    if a.is_unspecified() {
        Some(SpecialRange::Unspecified)
    } else if a.is_loopback() {
        Some(SpecialRange::Loopback)
    } else if s[..6] == [0; 6] {
        // IPv4-compatible (deprecated by RFC 4291).
        Some(SpecialRange::Reserved)
    } else if s[0] & 0xffc0 == 0xfe80 {
        Some(SpecialRange::LinkLocal)
    } else if s[0] & 0xffc0 == 0xfec0 {
        // Site-local (deprecated by RFC 3879).
        Some(SpecialRange::Reserved)
    } else if s[0] & 0xfe00 == 0xfc00 {
        Some(SpecialRange::Private)
    } else if s[0] & 0xff00 == 0xff00 {
        Some(SpecialRange::Multicast)
    } else {
        None
    }
}

/// The special ranges, as prefixes: closed ones first. IPv4-mapped IPv6 rules are
/// judged by the IPv4 rows (see [`in_range`]).
const SPECIAL_V4: [([u8; 4], u8, SpecialRange); 10] = [
    ([0, 0, 0, 0], 8, SpecialRange::Unspecified),
    ([127, 0, 0, 0], 8, SpecialRange::Loopback),
    ([169, 254, 0, 0], 16, SpecialRange::LinkLocal),
    ([224, 0, 0, 0], 4, SpecialRange::Multicast),
    ([240, 0, 0, 0], 4, SpecialRange::Reserved),
    ([192, 0, 0, 0], 24, SpecialRange::Reserved),
    ([10, 0, 0, 0], 8, SpecialRange::Private),
    ([172, 16, 0, 0], 12, SpecialRange::Private),
    ([192, 168, 0, 0], 16, SpecialRange::Private),
    ([100, 64, 0, 0], 10, SpecialRange::Shared),
];
const SPECIAL_V6: [(u128, u8, SpecialRange); 9] = [
    (0, 128, SpecialRange::Unspecified),
    (1, 128, SpecialRange::Loopback),
    // IPv4-compatible (and with it `::` and `::1`).
    (0, 96, SpecialRange::Reserved),
    (0xfe80 << 112, 10, SpecialRange::LinkLocal),
    (0xfec0 << 112, 10, SpecialRange::Reserved),
    (0xff00 << 112, 8, SpecialRange::Multicast),
    // NAT64 and 6to4 carry IPv4 addresses, any of them.
    (0x0064_ff9b << 96, 96, SpecialRange::Reserved),
    (0x2002 << 112, 16, SpecialRange::Reserved),
    (0xfc00 << 112, 7, SpecialRange::Private),
];

/// The special ranges address rule `rule` overlaps, closed ones first.
fn overlapped(rule: &HostRule) -> impl Iterator<Item = SpecialRange> + '_ {
    let v4 = SPECIAL_V4
        .iter()
        .map(|(n, p, r)| (IpAddr::from(*n), *p, *r));
    let v6 = SPECIAL_V6
        .iter()
        .map(|(n, p, r)| (IpAddr::from(Ipv6Addr::from(*n)), *p, *r));
    let range = match *rule {
        HostRule::Range { net, prefix } => Some((net, prefix)),
        _ => None,
    };
    v4.chain(v6)
        .filter_map(move |(special, special_prefix, r)| {
            let (net, prefix) = range?;
            // Two ranges overlap when they agree on the shorter prefix's bits.
            in_range(net, special, prefix.min(special_prefix)).then_some(r)
        })
}

fn in_range(addr: IpAddr, net: IpAddr, prefix: u8) -> bool {
    let addr = match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
        v4 => v4,
    };
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Lower-cases `name` and drops one trailing dot; `None` when it is not a host name:
/// 1 to 253 bytes of labels of 1 to 63 letters, digits, `-` and `_`, a label not
/// starting or ending with `-`.
pub fn normalize_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return None;
    }
    for label in name.split('.') {
        let b = label.as_bytes();
        if b.is_empty() || b.len() > 63 || b[0] == b'-' || b[b.len() - 1] == b'-' {
            return None;
        }
        if !b
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
        {
            return None;
        }
    }
    Some(name.to_ascii_lowercase())
}

/// An IPv4 address in any notation the classic resolver libraries accept
/// (`inet_aton`): one to four parts, each decimal, octal (a leading `0`) or
/// hexadecimal (`0x`), the last filling the bytes left (`127.1`, `2130706433`,
/// `0x7f.0.0.1`, `0177.0.0.1`). Programs pass such names to `connect` as addresses.
fn parse_ipv4_loose(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        let (digits, radix) =
            if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
                (hex, 16)
            } else if part.len() > 1 && part.starts_with('0') {
                (&part[1..], 8)
            } else {
                (*part, 10)
            };
        if digits.is_empty() && radix != 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        // `0x` alone is 0, as inet_aton reads it.
        let value = if digits.is_empty() {
            0
        } else {
            u64::from_str_radix(digits, radix).ok()?
        };
        values.push(value);
    }
    let (last, head) = values.split_last()?;
    if head.iter().any(|v| *v > 255) {
        return None;
    }
    let room = 8 * (4 - head.len() as u32);
    if *last >= 1u64 << room {
        return None;
    }
    let mut addr: u32 = 0;
    for (i, v) in head.iter().enumerate() {
        addr |= (*v as u32) << (24 - 8 * i as u32);
    }
    Some(Ipv4Addr::from(addr | *last as u32))
}

/// `text` as an address, when it is one in any notation: IPv6 (with or without
/// brackets), or IPv4 in any notation `inet_aton` reads (`127.1`, `2130706433`,
/// `0x7f.0.0.1`, `0177.0.0.1`). A host name that is not an
/// address is `None`.
pub fn parse_addr(text: &str) -> Option<IpAddr> {
    let bare = text.trim_start_matches('[').trim_end_matches(']');
    if let Ok(addr) = bare.parse::<IpAddr>() {
        return Some(addr);
    }
    parse_ipv4_loose(text.strip_suffix('.').unwrap_or(text)).map(IpAddr::V4)
}

fn parse_range(text: &str) -> Option<HostRule> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (text, None),
    };
    let addr = parse_addr(addr)?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            p.parse::<u8>().ok()?
        }
        Some(_) => return None,
        None => max,
    };
    if prefix > max {
        return None;
    }
    // The range's first address, so that display and comparison are canonical.
    let net = match addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
        }
    };
    Some(HostRule::Range { net, prefix })
}

impl EgressRules {
    /// Checks and compiles a policy's hosts and ports. A host that is neither a name,
    /// a `*.` wildcard nor an address or range, a port 0, or more than [`MAX_HOSTS`]
    /// hosts or [`MAX_PORTS`] ports is `INVALID_OPTIONS`, naming the entry under
    /// `field` (`network.allowlist`).
    pub fn compile(field: &str, hosts: &[String], ports: &[u16]) -> Result<EgressRules> {
        if hosts.is_empty() {
            return Err(Error::invalid_options(
                &format!("{field}.hosts"),
                "names no host; give at least one (a name, `*.domain`, or an address range), or use network `none`",
            ));
        }
        if hosts.len() > MAX_HOSTS {
            return Err(Error::invalid_options(
                &format!("{field}.hosts"),
                format!("holds {} hosts; at most {MAX_HOSTS}", hosts.len()),
            ));
        }
        if ports.len() > MAX_PORTS {
            return Err(Error::invalid_options(
                &format!("{field}.ports"),
                format!("holds {} ports; at most {MAX_PORTS}", ports.len()),
            ));
        }
        let mut rules = Vec::with_capacity(hosts.len());
        for (i, host) in hosts.iter().enumerate() {
            let rule = if let Some(below) = host.strip_prefix("*.") {
                normalize_name(below).map(|n| HostRule::Below(format!(".{n}")))
            } else if let Some(range) = parse_range(host) {
                Some(range)
            } else {
                normalize_name(host).map(HostRule::Exact)
            };
            let Some(rule) = rule else {
                return Err(Error::invalid_options(
                    &format!("{field}.hosts[{i}]"),
                    format!(
                        "`{}` is not a host name, a `*.` wildcard or an address range (such as `pypi.org`, `*.pythonhosted.org`, `198.51.100.0/24`)",
                        host.escape_debug()
                    ),
                ));
            };
            if let Some(range) = EgressRules::closed_range_overlapped(&rule) {
                return Err(Error::invalid_options(
                    &format!("{field}.hosts[{i}]"),
                    format!(
                        "`{}` reaches into the {} range, which no sandbox reaches (not even under network `unrestricted`); list public addresses or names",
                        host.escape_debug(),
                        range.as_str()
                    ),
                ));
            }
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
        let mut ports = if ports.is_empty() {
            DEFAULT_PORTS.to_vec()
        } else {
            ports.to_vec()
        };
        if let Some(i) = ports.iter().position(|p| *p == 0) {
            return Err(Error::invalid_options(
                &format!("{field}.ports[{i}]"),
                "port 0 is not a port; give 1 to 65535",
            ));
        }
        ports.sort_unstable();
        ports.dedup();
        Ok(EgressRules {
            hosts: rules,
            ports,
            any: false,
            private: false,
        })
    }

    /// The rules of network `unrestricted` on an engine whose sandboxes reach the
    /// network only through the gateway (the container engine): every name, every
    /// port, and every address but the closed ranges (the gateway dials from the
    /// host, where loopback is the host's own services and 169.254.169.254 its cloud
    /// metadata; the gateway adds the host's own addresses). Private and shared
    /// ranges are admitted when `private` says so (`[egress] allow_private`).
    pub fn unrestricted(private: bool) -> EgressRules {
        EgressRules {
            hosts: vec![HostRule::Any],
            ports: Vec::new(),
            any: true,
            private,
        }
    }

    /// Whether these are [`EgressRules::unrestricted`]'s.
    pub fn is_unrestricted(&self) -> bool {
        self.any
    }

    /// The host rules.
    pub fn hosts(&self) -> &[HostRule] {
        &self.hosts
    }

    /// The ports admitted, sorted (empty for [`EgressRules::unrestricted`], which
    /// admits all).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// Whether `port` is admitted.
    pub fn port_allowed(&self, port: u16) -> bool {
        self.any || self.ports.binary_search(&port).is_ok()
    }

    /// The rule that admits host name `name` (any case, a trailing dot allowed), if
    /// one does. A name that is an address literal is judged by
    /// [`EgressRules::rule_for_addr`] instead.
    pub fn rule_for_name(&self, name: &str) -> Option<&HostRule> {
        if let Some(addr) = parse_addr(name) {
            return self.rule_for_addr(addr);
        }
        let name = normalize_name(name)?;
        if self.any {
            return Some(&ANY);
        }
        self.hosts.iter().find(|r| r.admits_name(&name))
    }

    /// The address rule that covers `addr`, if one does. Under
    /// [`EgressRules::unrestricted`], every address [`EgressRules::check_resolved`]
    /// admits.
    pub fn rule_for_addr(&self, addr: IpAddr) -> Option<&HostRule> {
        if self.any {
            return self.check_resolved(addr).is_ok().then_some(&ANY);
        }
        self.hosts.iter().find(|r| r.covers(addr))
    }

    /// The special range that address rule `rule` overlaps and that no policy
    /// reaches ([`SpecialRange::is_closed`]: unspecified, loopback, link-local,
    /// multicast, reserved, and the IPv6 ranges that carry IPv4 addresses), if any;
    /// `None` for other rules. [`EgressRules::compile`] refuses such a rule.
    pub fn closed_range_overlapped(rule: &HostRule) -> Option<SpecialRange> {
        overlapped(rule).find(|r| r.is_closed())
    }

    /// The private or shared range that address rule `rule` overlaps, if any: what
    /// only a caller the operator allows private ranges may list.
    pub fn private_range_overlapped(rule: &HostRule) -> Option<SpecialRange> {
        overlapped(rule).find(|r| !r.is_closed())
    }

    /// Whether everything `rule` admits, these rules admit too: a name these admit,
    /// a wildcard inside one of these wildcards, a range inside one of these
    /// ranges (for narrowing one policy by another).
    pub fn admits_rule(&self, rule: &HostRule) -> bool {
        if self.any {
            return true;
        }
        match rule {
            HostRule::Exact(name) => self.hosts.iter().any(|h| h.admits_name(name)),
            HostRule::Below(suffix) => self.hosts.iter().any(|h| match h {
                HostRule::Below(outer) => suffix.ends_with(outer.as_str()),
                HostRule::Any => true,
                _ => false,
            }),
            HostRule::Range { net, prefix } => self.hosts.iter().any(|h| match *h {
                HostRule::Range {
                    net: outer,
                    prefix: outer_prefix,
                } => {
                    net.is_ipv4() == outer.is_ipv4()
                        && outer_prefix <= *prefix
                        && in_range(*net, outer, outer_prefix)
                }
                HostRule::Any => true,
                _ => false,
            }),
            HostRule::Any => false,
        }
    }

    /// Whether a connection to `addr` may be made for a name this allowlist admits:
    /// refused with the range's name when `addr` lies in a closed range (whatever
    /// the rules say), or in a private or shared one that no address rule covers.
    /// Under [`EgressRules::unrestricted`], private and shared ranges are open when
    /// it was made so.
    pub fn check_resolved(&self, addr: IpAddr) -> std::result::Result<(), SpecialRange> {
        match SpecialRange::of(addr) {
            None => Ok(()),
            Some(range) if range.is_closed() => Err(range),
            Some(range) if self.any => {
                if self.private {
                    Ok(())
                } else {
                    Err(range)
                }
            }
            Some(_) if self.hosts.iter().any(|r| r.covers(addr)) => Ok(()),
            Some(range) => Err(range),
        }
    }
}

/// What became of one attempt of a sandbox to reach the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EgressVerdict {
    /// Admitted and connected (or, for DNS, answered).
    Allowed,
    /// Refused by the policy.
    Denied,
    /// Admitted, but the target could not be reached.
    Failed,
}

/// How an attempt reached Paddock's gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EgressVia {
    /// An HTTP `CONNECT` through the proxy (`HTTPS_PROXY`).
    Connect,
    /// A plain HTTP request through the proxy (`HTTP_PROXY`).
    Http,
    /// A TCP connection redirected to the gateway (a program that ignores proxies).
    Transparent,
    /// A DNS question to the sandbox's resolver.
    Dns,
}

/// One egress decision, as the audit entry of an execution or session lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EgressEvent {
    /// When the attempt was made (Unix milliseconds).
    pub at_ms: u64,
    /// How it reached the gateway.
    pub via: EgressVia,
    /// The host asked for (a name or an address), as the program gave it.
    pub host: String,
    /// The port asked for (53 for DNS).
    pub port: u16,
    /// The address dialled or answered, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// What became of it.
    pub verdict: EgressVerdict,
    /// The rule that admitted it, or why it was refused or failed.
    pub reason: String,
    /// Bytes from the sandbox to the target.
    #[serde(default)]
    pub bytes_out: u64,
    /// Bytes from the target to the sandbox.
    #[serde(default)]
    pub bytes_in: u64,
}

/// The most decisions one execution's result and audit entry list; later ones are
/// counted in [`EgressReport::omitted`].
pub const MAX_REPORTED_EVENTS: usize = 128;

/// What an execution's egress came to: its decisions, in order, and how many more
/// there were than a result lists (or than the gateway's bounded log kept).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EgressReport {
    /// The decisions, at most [`MAX_REPORTED_EVENTS`].
    pub events: Vec<EgressEvent>,
    /// Decisions made but not listed.
    #[serde(default)]
    pub omitted: u64,
    /// How many were allowed, of all of them (listed or not).
    #[serde(default)]
    pub allowed: u64,
    /// How many were denied, of all of them (listed or not).
    #[serde(default)]
    pub denied: u64,
}

impl EgressReport {
    /// The report of `events` (in order), of which the gateway's log lost `lost`
    /// before they were read.
    pub fn of(mut events: Vec<EgressEvent>, lost: u64) -> EgressReport {
        let allowed = events
            .iter()
            .filter(|e| e.verdict == EgressVerdict::Allowed)
            .count() as u64;
        let denied = events
            .iter()
            .filter(|e| e.verdict == EgressVerdict::Denied)
            .count() as u64;
        let cut = events.len().saturating_sub(MAX_REPORTED_EVENTS) as u64;
        events.truncate(MAX_REPORTED_EVENTS);
        EgressReport {
            events,
            omitted: cut + lost,
            allowed,
            denied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(hosts: &[&str]) -> EgressRules {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        EgressRules::compile("network.allowlist", &hosts, &[]).unwrap()
    }

    #[test]
    fn names_wildcards_and_ranges_admit_what_they_say() {
        let r = rules(&[
            "PyPI.org.",
            "*.pythonhosted.org",
            "198.51.100.0/24",
            "2001:db8::1",
        ]);
        assert_eq!(r.ports(), &[80, 443]);
        assert_eq!(r.rule_for_name("pypi.org").unwrap().to_string(), "pypi.org");
        assert_eq!(
            r.rule_for_name("PYPI.ORG.").unwrap().to_string(),
            "pypi.org"
        );
        assert!(r.rule_for_name("evil-pypi.org").is_none());
        assert!(r.rule_for_name("pypi.org.evil.com").is_none());
        let w = r.rule_for_name("files.pythonhosted.org").unwrap();
        assert_eq!(w.to_string(), "*.pythonhosted.org");
        assert!(r.rule_for_name("a.b.pythonhosted.org").is_some());
        assert!(r.rule_for_name("pythonhosted.org").is_none());
        assert!(r.rule_for_name("xpythonhosted.org").is_none());
        assert_eq!(
            r.rule_for_name("198.51.100.9").unwrap().to_string(),
            "198.51.100.0/24"
        );
        assert!(r.rule_for_name("198.51.101.9").is_none());
        assert!(r.rule_for_name("[2001:db8::1]").is_some());
        // Addresses in other notations are addresses, not names.
        assert_eq!(
            r.rule_for_name("3325256711").unwrap().to_string(),
            "198.51.100.0/24"
        );
        assert!(r.rule_for_name("0xc6.51.100.7").is_some());
        assert!(r
            .rule_for_addr("::ffff:198.51.100.3".parse().unwrap())
            .is_some());
        assert!(r.port_allowed(443) && !r.port_allowed(22));
    }

    #[test]
    fn special_ranges_need_an_address_rule() {
        let r = rules(&["allowed.test", "10.1.0.0/16"]);
        for (addr, range) in [
            ("127.0.0.1", SpecialRange::Loopback),
            ("169.254.169.254", SpecialRange::LinkLocal),
            ("10.2.0.1", SpecialRange::Private),
            ("172.20.0.1", SpecialRange::Private),
            ("192.168.1.1", SpecialRange::Private),
            ("100.64.0.1", SpecialRange::Shared),
            ("224.0.0.1", SpecialRange::Multicast),
            ("255.255.255.255", SpecialRange::Reserved),
            ("0.0.0.0", SpecialRange::Unspecified),
            ("::1", SpecialRange::Loopback),
            ("fe80::1", SpecialRange::LinkLocal),
            ("fd00::1", SpecialRange::Private),
            ("::ffff:169.254.169.254", SpecialRange::LinkLocal),
        ] {
            assert_eq!(
                r.check_resolved(addr.parse().unwrap()),
                Err(range),
                "{addr}"
            );
        }
        assert_eq!(r.check_resolved("10.1.2.3".parse().unwrap()), Ok(()));
        assert_eq!(r.check_resolved("198.51.100.7".parse().unwrap()), Ok(()));
        assert_eq!(r.check_resolved("2001:db8::1".parse().unwrap()), Ok(()));
        assert_eq!(r.check_resolved("172.32.0.1".parse().unwrap()), Ok(()));
    }

    #[test]
    fn unrestricted_admits_every_name_and_port_but_not_the_hosts_own_or_link_local_addresses() {
        let r = EgressRules::unrestricted(true);
        assert!(r.is_unrestricted());
        assert!(!rules(&["a.org"]).is_unrestricted());
        assert_eq!(
            r.rule_for_name("anything.example").map(ToString::to_string),
            Some("unrestricted".to_string())
        );
        assert!(r.rule_for_name("not a name").is_none());
        assert!(r.port_allowed(22) && r.port_allowed(65535));
        for open in [
            "198.51.100.7",
            "10.2.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "2001:db8::1",
        ] {
            let ip = open.parse().unwrap();
            assert_eq!(r.check_resolved(ip), Ok(()), "{open}");
            assert!(r.rule_for_addr(ip).is_some(), "{open}");
        }
        for (closed, range) in [
            ("127.0.0.1", SpecialRange::Loopback),
            ("169.254.169.254", SpecialRange::LinkLocal),
            ("::ffff:127.0.0.1", SpecialRange::Loopback),
            ("0.0.0.0", SpecialRange::Unspecified),
            ("224.0.0.1", SpecialRange::Multicast),
        ] {
            let ip = closed.parse().unwrap();
            assert_eq!(r.check_resolved(ip), Err(range), "{closed}");
            assert!(r.rule_for_addr(ip).is_none(), "{closed}");
            assert!(r.rule_for_name(closed).is_none(), "{closed}");
        }
    }

    #[test]
    fn unrestricted_without_private_ranges_reaches_public_addresses_only() {
        let r = EgressRules::unrestricted(false);
        for closed in ["10.2.0.1", "192.168.1.1", "100.64.0.1", "fd00::1"] {
            assert!(
                r.check_resolved(closed.parse().unwrap()).is_err(),
                "{closed}"
            );
        }
        assert_eq!(r.check_resolved("198.51.100.7".parse().unwrap()), Ok(()));
    }

    /// Every spelling of a closed address, as an entry: refused when compiled,
    /// naming the entry and the range.
    #[test]
    fn address_rules_never_open_a_closed_range() {
        for (entry, range) in [
            ("127.0.0.1", "loopback"),
            ("127.0.0.0/8", "loopback"),
            ("127.1", "loopback"),
            ("2130706433", "loopback"),
            ("0x7f000001", "loopback"),
            ("0x7f.0.0.1", "loopback"),
            ("0177.0.0.1", "loopback"),
            ("017700000001", "loopback"),
            ("169.254.169.254", "link-local"),
            ("169.254.0.0/16", "link-local"),
            ("169.0.0.0/8", "link-local"),
            ("2852039166", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("0.0.0.0/0", "unspecified"),
            ("0", "unspecified"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("::", "unspecified"),
            ("::/0", "unspecified"),
            ("::1", "loopback"),
            ("[::1]", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:0:0/96", "unspecified"),
            ("::127.0.0.1", "reserved"),
            ("64:ff9b::7f00:1", "reserved"),
            ("2002:7f00:1::", "reserved"),
            ("2002::/16", "reserved"),
            ("fe80::1", "link-local"),
            ("fec0::1", "reserved"),
            ("ff02::1", "multicast"),
        ] {
            let e = EgressRules::compile(
                "network.allowlist",
                &["ok.org".to_string(), entry.to_string()],
                &[],
            )
            .unwrap_err();
            assert_eq!(e.code, crate::ErrorCode::InvalidOptions, "{entry}");
            assert!(
                e.message.contains("network.allowlist.hosts[1]") && e.message.contains(range),
                "{entry}: {}",
                e.message
            );
        }
        // Private and public ranges compile; admission decides on private ones.
        for ok in ["10.0.0.0/8", "198.51.100.0/24", "8.8.8.8", "2001:db8::/32"] {
            assert!(
                EgressRules::compile("n", &[ok.to_string()], &[]).is_ok(),
                "{ok}"
            );
        }
    }

    /// A name that resolves into a closed range is refused when dialled, whatever
    /// the allowlist (the gateway's check), and an address in an embedded form is
    /// judged as the IPv4 address it carries.
    #[test]
    fn resolved_addresses_in_closed_ranges_are_refused_under_every_policy() {
        let wide = rules(&["*.example.org", "198.51.100.0/24", "10.0.0.0/8"]);
        for policy in [wide, EgressRules::unrestricted(true)] {
            for addr in [
                "127.0.0.1",
                "127.255.0.9",
                "169.254.169.254",
                "0.0.0.0",
                "224.0.0.251",
                "255.255.255.255",
                "::1",
                "::",
                "::ffff:127.0.0.1",
                "64:ff9b::a9fe:a9fe",
                "2002:7f00:1::1",
                "::7f00:1",
                "fe80::1",
                "fec0::1",
            ] {
                let ip: IpAddr = addr.parse().unwrap();
                let range = policy.check_resolved(ip).unwrap_err();
                assert!(range.is_closed(), "{addr}: {range:?}");
            }
        }
        assert_eq!(
            SpecialRange::of("2002:0808:0808::1".parse().unwrap()),
            None,
            "6to4 of a public address"
        );
    }

    #[test]
    fn private_rules_are_told_apart_from_closed_ones() {
        let rule = |text: &str| parse_range(text).unwrap();
        assert_eq!(
            EgressRules::private_range_overlapped(&rule("10.1.0.0/16")),
            Some(SpecialRange::Private)
        );
        assert_eq!(
            EgressRules::private_range_overlapped(&rule("100.64.0.0/10")),
            Some(SpecialRange::Shared)
        );
        assert_eq!(
            EgressRules::private_range_overlapped(&rule("fd00::/8")),
            Some(SpecialRange::Private)
        );
        assert_eq!(
            EgressRules::private_range_overlapped(&rule("8.0.0.0/7")),
            None
        );
        assert_eq!(
            EgressRules::closed_range_overlapped(&rule("10.0.0.0/8")),
            None
        );
    }

    #[test]
    fn loose_ipv4_notations_read_as_inet_aton_does() {
        for (text, addr) in [
            ("127.1", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0x7f.1", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("10.0x10.1", "10.16.0.1"),
            ("0", "0.0.0.0"),
            ("1.2.3.4", "1.2.3.4"),
        ] {
            assert_eq!(
                parse_ipv4_loose(text),
                Some(addr.parse().unwrap()),
                "{text}"
            );
        }
        for not in [
            "",
            "1.2.3.4.5",
            "256.1",
            "1.2.3.256",
            "08",
            "0x",
            "a.b",
            "1..2",
            "4294967296",
        ] {
            // (`0x` alone reads as 0 in inet_aton; it is not a name either.)
            if not == "0x" {
                continue;
            }
            assert_eq!(parse_ipv4_loose(not), None, "{not}");
        }
        assert_eq!(
            parse_addr("[2001:db8::1]"),
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(parse_addr("pypi.org"), None);
    }

    #[test]
    fn bad_entries_are_named() {
        let compile = |hosts: &[&str], ports: &[u16]| {
            let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
            EgressRules::compile("network.allowlist", &hosts, ports)
        };
        for bad in [
            "",
            "*",
            "*.",
            "a..b",
            "-a.org",
            "a b",
            "x/33",
            "10.0.0.0/33",
            "1.2.3.4/",
            "*.*.org",
            "ex\u{e4}mple.org",
        ] {
            let e = compile(&["ok.org", bad], &[]).unwrap_err();
            assert_eq!(e.code, crate::ErrorCode::InvalidOptions, "{bad}");
            assert!(
                e.message.contains("network.allowlist.hosts[1]"),
                "{}",
                e.message
            );
        }
        let e = compile(&[], &[]).unwrap_err();
        assert!(
            e.message.contains("network.allowlist.hosts"),
            "{}",
            e.message
        );
        let e = compile(&["a.org"], &[443, 0]).unwrap_err();
        assert!(e.message.contains("ports[1]"), "{}", e.message);
        let many: Vec<&str> = std::iter::repeat_n("a.org", MAX_HOSTS + 1).collect();
        assert!(compile(&many, &[]).is_err());
        let long = format!("{}.org", "a".repeat(250));
        assert!(compile(&[&long], &[]).is_err());
        let r = compile(&["a.org", "A.org"], &[443, 80, 443]).unwrap();
        assert_eq!(r.hosts().len(), 1);
        assert_eq!(r.ports(), &[80, 443]);
    }
}
