//! The oldest `nats-server` a node joins: checked at join from the version the
//! server gives in its INFO, so that an older one is refused at once, by name,
//! instead of failing later (a 2.9 server cannot make the KV buckets) after
//! minutes of retries.
//!
//! Why 2.11.0, what the fleet really needs of the server:
//! - its KV buckets are made with async-nats 0.51's `create_key_value`, which
//!   reads the account's JetStream info first and needs its `reserved_memory` and
//!   `reserved_storage`: servers report them from 2.10.8 on (Debian 12's 2.9.10
//!   does not);
//! - every publish (an order, an audit entry) is retried through a failover with
//!   the same message id, and must not take an entry that was never stored for a
//!   duplicate. A 2.10 server answers a publish whose id it holds for one still in
//!   flight (or lost with a proposal that never committed) as a duplicate with
//!   sequence 0, and keeps such ids across leader changes; 2.11.0 answers it with
//!   an error (409, "duplicate message id is in process") and drops them when the
//!   leader changes.
//!
//! The rest the fleet uses is older: streams with message-id deduplication,
//! work-queue retention and `allow_direct`, KV compare-and-set, pull consumers with
//! progress acks and delayed naks, ordered consumers made with
//! `CONSUMER.CREATE.<stream>.<name>.<filter>` (2.9). It uses no per-message TTL
//! and no priority group.

use std::cmp::Ordering;
use std::fmt;

/// The oldest `nats-server` a fleet node joins.
pub(crate) const MINIMUM: ServerVersion = ServerVersion {
    major: 2,
    minor: 11,
    patch: 0,
    pre_release: false,
};

/// A `nats-server` version as the server gives it (`2.15.1`, `2.11.0-RC.2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerVersion {
    major: u64,
    minor: u64,
    patch: u64,
    /// A pre-release (`-RC.2`, `-beta`) comes before its release.
    pre_release: bool,
}

impl ServerVersion {
    /// `major.minor.patch`, optionally followed by `-pre-release` and `+build`
    /// (a missing patch reads as 0); `None` for anything else.
    pub(crate) fn parse(text: &str) -> Option<ServerVersion> {
        let text = text.trim().trim_start_matches('v');
        let text = text.split('+').next().unwrap_or_default();
        let (core, pre) = match text.split_once('-') {
            Some((core, pre)) => (core, !pre.is_empty()),
            None => (text, false),
        };
        let mut parts = core.split('.');
        let mut number = |required: bool| match parts.next() {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok(),
            None if !required => Some(0),
            _ => None,
        };
        let version = ServerVersion {
            major: number(true)?,
            minor: number(true)?,
            patch: number(false)?,
            pre_release: pre,
        };
        parts.next().is_none().then_some(version)
    }
}

impl Ord for ServerVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            // A release comes after its pre-releases.
            .then_with(|| other.pre_release.cmp(&self.pre_release))
    }
}

impl PartialOrd for ServerVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if self.pre_release {
            f.write_str("-pre")?;
        }
        Ok(())
    }
}

/// Whether a server giving `version` is new enough for the fleet; an unreadable
/// version is not.
pub(crate) fn supported(version: &str) -> bool {
    ServerVersion::parse(version).is_some_and(|v| v >= MINIMUM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_servers_give_them() {
        let v = |t: &str| ServerVersion::parse(t).unwrap();
        assert_eq!(v("2.15.1"), v("v2.15.1"));
        assert_eq!(v("2.10"), v("2.10.0"));
        assert_eq!(v("2.11.0+build.7"), v("2.11.0"));
        assert!(v("2.11.0-RC.2").pre_release);
        for bad in [
            "",
            "2",
            "two.ten.eight",
            "2.10.8.1",
            "2..8",
            "2.10.x",
            "-2.10.8",
        ] {
            assert_eq!(ServerVersion::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn versions_compare_by_number_then_release() {
        let v = |t: &str| ServerVersion::parse(t).unwrap();
        assert!(v("2.10.10") > v("2.10.9"), "numbers, not text");
        assert!(v("2.9.25") < v("2.10.0"));
        assert!(v("3.0.0") > v("2.99.99"));
        assert!(v("2.11.0-RC.1") < v("2.11.0"));
        assert!(v("2.11.0-RC.1") > v("2.10.29"));
        assert_eq!(v("2.15.1").cmp(&v("2.15.1")), Ordering::Equal);
    }

    #[test]
    fn the_minimum_is_2_11_0() {
        assert_eq!(MINIMUM.to_string(), "2.11.0");
        // Debian 12's server (no bucket), and 2.10 (duplicates with sequence 0),
        // its last release included, are refused.
        for old in ["2.9.10", "2.10.0", "2.10.8", "2.10.29", "2.11.0-RC.1"] {
            assert!(!supported(old), "{old}");
        }
        for new in ["2.11.0", "2.11.11", "2.12.8", "2.15.1", "3.0.0"] {
            assert!(supported(new), "{new}");
        }
        assert!(!supported("nightly"), "an unreadable version");
    }
}
