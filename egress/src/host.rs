//! The host's own addresses: what no sandbox reaches through the gateway, whatever
//! its policy. The gateway dials from Paddock's own network namespace, where every
//! address of every interface (a public one included) leads to the host's own
//! services: `paddock serve` listening on `0.0.0.0`, a database, an agent.
//!
//! The list is read from the interfaces of the namespace the gateway's threads run
//! in (`getifaddrs`), and read again when it is more than [`REFRESH`] old, so that
//! an address added while Paddock runs is covered within that time.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How old the list may be before it is read again.
pub const REFRESH: Duration = Duration::from_secs(1);

struct Cached {
    at: Instant,
    addrs: Arc<HashSet<IpAddr>>,
}

static CACHE: Mutex<Option<Cached>> = Mutex::new(None);

/// The addresses of the calling thread's namespace's interfaces, at most
/// [`REFRESH`] old. A failed read keeps the last list (an empty one at first),
/// and is logged.
pub fn own_addresses() -> Arc<HashSet<IpAddr>> {
    let mut cache = CACHE.lock();
    if let Some(c) = cache.as_ref() {
        if c.at.elapsed() < REFRESH {
            return c.addrs.clone();
        }
    }
    let addrs = match crate::sys::interface_addrs() {
        Ok(list) => Arc::new(list.into_iter().map(canonical).collect()),
        Err(e) => {
            tracing::warn!(error = %e, "the host's addresses could not be read");
            cache.as_ref().map(|c| c.addrs.clone()).unwrap_or_default()
        }
    };
    *cache = Some(Cached {
        at: Instant::now(),
        addrs: addrs.clone(),
    });
    addrs
}

/// Whether `addr` (an IPv4-mapped IPv6 address as its IPv4 one) is one of the
/// host's own.
pub fn is_own(addr: IpAddr) -> bool {
    own_addresses().contains(&canonical(addr))
}

fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_address_is_among_the_hosts_own() {
        assert!(is_own("127.0.0.1".parse().unwrap()));
        assert!(is_own("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_own("198.51.100.250".parse().unwrap()));
    }
}
