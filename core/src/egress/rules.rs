//! The compiled allowlist: [`HostRule`]s and the [`EgressRules`] that admit names,
//! addresses and ports.

use std::fmt;
use std::net::IpAddr;

use super::parse::parse_range;
use super::special::{in_range, overlapped};
use super::{normalize_name, parse_addr, SpecialRange, DEFAULT_PORTS, MAX_HOSTS, MAX_PORTS};
use crate::error::{Error, Result};

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
