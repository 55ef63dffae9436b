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
//!
//! [`EgressRules`] and [`HostRule`] are the compiled allowlist, [`SpecialRange`] the
//! closed and private ranges, and [`EgressReport`] what a sandbox's attempts came to.

mod parse;
mod report;
mod rules;
mod special;

pub use parse::{normalize_name, parse_addr};
pub use report::{EgressEvent, EgressReport, EgressVerdict, EgressVia, MAX_REPORTED_EVENTS};
pub use rules::{EgressRules, HostRule};
pub use special::SpecialRange;

/// The ports an allowlist admits when it names none.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];
/// The most host rules one policy may hold.
pub const MAX_HOSTS: usize = 256;
/// The most ports one policy may hold.
pub const MAX_PORTS: usize = 64;
/// The longest host name (RFC 1035, without the trailing dot).
pub const MAX_NAME_LEN: usize = 253;
