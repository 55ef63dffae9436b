//! Egress allowlists: which hosts and ports a sandbox under network policy
//! `allowlist` may reach, checked once at admission and then on every connection and
//! every DNS answer.
//!
//! A policy names hosts three ways: an exact name (`pypi.org`), a wildcard for the
//! names below one (`*.pythonhosted.org`: `files.pythonhosted.org` and
//! `a.b.pythonhosted.org`, not `pythonhosted.org` itself), and an address or range
//! (`198.51.100.7`, `10.0.0.0/8`). Ports default to 80 and 443.
//!
//! Addresses in the special ranges (loopback, link-local and so the cloud metadata
//! address 169.254.169.254, private, shared, multicast, reserved, and their IPv6
//! counterparts) are refused even for an allowed name, unless an address rule of the
//! policy covers them: a name that resolves there is the classic server-side request
//! forgery, and only an explicit range says the operator meant it.

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

    /// The special range `addr` lies in, if any. An IPv4-mapped IPv6 address is
    /// judged as its IPv4 address.
    pub fn of(addr: IpAddr) -> Option<SpecialRange> {
        match addr {
            IpAddr::V4(a) => special_v4(a),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => special_v4(v4),
                None => special_v6(a),
            },
        }
    }
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
    } else if s[0] & 0xffc0 == 0xfe80 {
        Some(SpecialRange::LinkLocal)
    } else if s[0] & 0xfe00 == 0xfc00 {
        Some(SpecialRange::Private)
    } else if s[0] & 0xff00 == 0xff00 {
        Some(SpecialRange::Multicast)
    } else {
        None
    }
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

fn parse_range(text: &str) -> Option<HostRule> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (text, None),
    };
    let addr: IpAddr = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
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
        })
    }

    /// The rules of network `unrestricted` on an engine whose sandboxes reach the
    /// network only through the gateway (the container engine): every name, every
    /// port, and every address but the host's own and the link-local ones (the
    /// gateway dials from the host, where loopback is the host's own services and
    /// 169.254.169.254 its cloud metadata). Private and shared ranges are admitted,
    /// as the host reaches them.
    pub fn unrestricted() -> EgressRules {
        EgressRules {
            hosts: vec![HostRule::Any],
            ports: Vec::new(),
            any: true,
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
        if let Ok(addr) = name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
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

    /// The special range that address rule `rule` overlaps and that
    /// [`EgressRules::unrestricted`] never reaches (unspecified, loopback,
    /// link-local, multicast, reserved), if any; `None` for other rules.
    pub fn closed_range_overlapped(rule: &HostRule) -> Option<SpecialRange> {
        const CLOSED_V4: [([u8; 4], u8, SpecialRange); 6] = [
            ([0, 0, 0, 0], 8, SpecialRange::Unspecified),
            ([127, 0, 0, 0], 8, SpecialRange::Loopback),
            ([169, 254, 0, 0], 16, SpecialRange::LinkLocal),
            ([224, 0, 0, 0], 4, SpecialRange::Multicast),
            ([240, 0, 0, 0], 4, SpecialRange::Reserved),
            ([192, 0, 0, 0], 24, SpecialRange::Reserved),
        ];
        const CLOSED_V6: [(u128, u8, SpecialRange); 4] = [
            (0, 128, SpecialRange::Unspecified),
            (1, 128, SpecialRange::Loopback),
            (0xfe80 << 112, 10, SpecialRange::LinkLocal),
            (0xff00 << 112, 8, SpecialRange::Multicast),
        ];
        let HostRule::Range { net, prefix } = *rule else {
            return None;
        };
        // Two ranges overlap when they agree on the shorter prefix's bits.
        let v4 = CLOSED_V4.iter().map(|(n, p, r)| (IpAddr::from(*n), *p, *r));
        let v6 = CLOSED_V6
            .iter()
            .map(|(n, p, r)| (IpAddr::from(Ipv6Addr::from(*n)), *p, *r));
        v4.chain(v6)
            .find(|(closed, closed_prefix, _)| in_range(net, *closed, prefix.min(*closed_prefix)))
            .map(|(_, _, r)| r)
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
    /// refused with the range's name when `addr` lies in a special range that no
    /// address rule covers. Under [`EgressRules::unrestricted`], only the private
    /// and shared ranges are open.
    pub fn check_resolved(&self, addr: IpAddr) -> std::result::Result<(), SpecialRange> {
        match SpecialRange::of(addr) {
            Some(SpecialRange::Private | SpecialRange::Shared) if self.any => Ok(()),
            Some(range) if self.any => Err(range),
            Some(range) if self.rule_for_addr(addr).is_none() => Err(range),
            _ => Ok(()),
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
        let r = rules(&["PyPI.org.", "*.pythonhosted.org", "198.51.100.0/24", "::1"]);
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
        assert!(r.rule_for_name("[::1]").is_some());
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
        let r = EgressRules::unrestricted();
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
