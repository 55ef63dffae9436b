//! Reading the entries of an allowlist: host names, addresses in any IPv4 notation a
//! resolver accepts, and address ranges.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{HostRule, MAX_NAME_LEN};

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

pub(super) fn parse_range(text: &str) -> Option<HostRule> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
