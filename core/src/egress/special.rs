//! The special ranges: closed ones no policy reaches and private ones only an address
//! rule opens.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use super::HostRule;

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
pub(super) fn overlapped(rule: &HostRule) -> impl Iterator<Item = SpecialRange> + '_ {
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

pub(super) fn in_range(addr: IpAddr, net: IpAddr, prefix: u8) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::parse::parse_range;
    use crate::egress::EgressRules;

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
}
