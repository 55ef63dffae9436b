//! Connections that have presented no credential yet, and how many of them the
//! server holds.
//!
//! Every accepted connection starts out unauthenticated and is counted, in total
//! (`server.max_unauthenticated_connections`) and per client address
//! (`server.max_unauthenticated_connections_per_address`; an IPv6 client counts by
//! its /64). A connection leaves the count the first time a request on it presents a
//! valid credential ([`authenticated`]): an API key on the native API, or, on the E2B
//! surface, an API key, a sandbox's access token or the address of an open sandbox.
//!
//! When a new connection would pass a cap, the oldest unauthenticated connection
//! (of its address, for the per-address cap) is shut down at once, before the new
//! one is served. A client that talks gets its request read within milliseconds of
//! connecting and leaves the count; what the caps close are connections that stay
//! silent, or keep sending requests without a credential. So a flood of idle
//! connections holds at most the caps' worth of descriptors, and never locks out a
//! client that connects after it.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv6Addr, Shutdown, TcpStream};
use std::sync::Arc;

use actix_web::HttpRequest;
use parking_lot::Mutex;

/// The count of unauthenticated connections, with its caps.
#[derive(Debug)]
pub(super) struct Gate {
    max_total: usize,
    max_per_address: usize,
    waiting: Mutex<Waiting>,
}

/// The unauthenticated connections, oldest first, and by address.
#[derive(Debug, Default)]
struct Waiting {
    next: u64,
    by_age: BTreeMap<u64, Entry>,
    by_address: HashMap<IpAddr, BTreeSet<u64>>,
}

/// One unauthenticated connection: its client's address (as counted) and a copy of
/// its socket, to shut it down by.
#[derive(Debug)]
struct Entry {
    address: IpAddr,
    socket: Option<Arc<TcpStream>>,
}

/// A connection's place among the unauthenticated ones, kept in the connection's
/// data; given back when the connection presents a credential or ends.
#[derive(Debug)]
struct Unauthenticated {
    gate: Arc<Gate>,
    seq: u64,
    released: Cell<bool>,
}

impl Unauthenticated {
    fn release(&self) {
        if !self.released.replace(true) {
            self.gate.release(self.seq);
        }
    }
}

impl Drop for Unauthenticated {
    fn drop(&mut self) {
        self.release();
    }
}

/// The address a client is counted under: an IPv4 address as it is (an IPv4-mapped
/// IPv6 one as its IPv4 address), an IPv6 address by its /64, which one subscriber
/// usually holds whole.
fn counted_as(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl Gate {
    /// A gate with these caps (each at least 1).
    pub(super) fn new(max_total: u32, max_per_address: u32) -> Arc<Gate> {
        Arc::new(Gate {
            max_total: (max_total as usize).max(1),
            max_per_address: (max_per_address as usize).max(1),
            waiting: Mutex::new(Waiting::default()),
        })
    }

    /// Counts a new connection from `peer`, first shutting down the oldest
    /// unauthenticated connections that would leave it over a cap.
    fn admit(
        self: &Arc<Self>,
        peer: Option<IpAddr>,
        socket: Option<Arc<TcpStream>>,
    ) -> Unauthenticated {
        let address = peer.map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), counted_as);
        let mut closing = Vec::new();
        let seq = {
            let mut waiting = self.waiting.lock();
            let Waiting {
                next,
                by_age,
                by_address,
            } = &mut *waiting;
            let seq = *next;
            *next += 1;
            let mine = by_address.entry(address).or_default();
            while mine.len() >= self.max_per_address {
                let Some(oldest) = mine.pop_first() else {
                    break;
                };
                if let Some(e) = by_age.remove(&oldest) {
                    closing.push(e.socket);
                }
            }
            mine.insert(seq);
            while by_age.len() >= self.max_total {
                let Some((oldest, e)) = by_age.pop_first() else {
                    break;
                };
                if let Some(set) = by_address.get_mut(&e.address) {
                    set.remove(&oldest);
                    if set.is_empty() {
                        by_address.remove(&e.address);
                    }
                }
                closing.push(e.socket);
            }
            by_age.insert(seq, Entry { address, socket });
            seq
        };
        if !closing.is_empty() {
            tracing::debug!(
                closed = closing.len(),
                "unauthenticated connections over server.max_unauthenticated_connections(_per_address) closed, oldest first"
            );
        }
        // Outside the lock: the connection's own worker sees its socket end and
        // drops it.
        for socket in closing.into_iter().flatten() {
            let _ = socket.shutdown(Shutdown::Both);
        }
        Unauthenticated {
            gate: self.clone(),
            seq,
            released: Cell::new(false),
        }
    }

    /// Forgets connection `seq` (authenticated, ended, or already closed by a cap).
    fn release(&self, seq: u64) {
        let mut waiting = self.waiting.lock();
        if let Some(e) = waiting.by_age.remove(&seq) {
            if let Some(set) = waiting.by_address.get_mut(&e.address) {
                set.remove(&seq);
                if set.is_empty() {
                    waiting.by_address.remove(&e.address);
                }
            }
        }
    }

    /// Unauthenticated connections held now, in total and from `address`.
    #[cfg(test)]
    fn held(&self, address: IpAddr) -> (usize, usize) {
        let waiting = self.waiting.lock();
        let of = waiting
            .by_address
            .get(&counted_as(address))
            .map_or(0, BTreeSet::len);
        (waiting.by_age.len(), of)
    }
}

/// What runs for every accepted connection (plain or TLS): keeps a copy of its socket
/// for [`client_gone`](super::client_gone) and counts it among the unauthenticated
/// connections of `gate`.
pub(super) fn on_connect(
    gate: Arc<Gate>,
) -> impl Fn(&dyn std::any::Any, &mut actix_web::dev::Extensions) + Send + Sync + 'static {
    move |conn, ext| {
        let socket = super::closing::remember_socket(conn, ext);
        let peer = socket
            .as_ref()
            .and_then(|s| s.peer_addr().ok())
            .map(|a| a.ip());
        let place = gate.admit(peer, socket);
        ext.insert(place);
    }
}

/// Marks the connection of `req` as having presented a valid credential: it no
/// longer counts against `server.max_unauthenticated_connections` and is never
/// closed to make room. Surfaces call it once they have checked a request's
/// credential (the native API does for its own keys); calling it again is free.
pub fn authenticated(req: &HttpRequest) {
    if let Some(place) = req.conn_data::<Unauthenticated>() {
        place.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn over_the_per_address_cap_the_addresss_oldest_goes() {
        let gate = Gate::new(10, 2);
        let a1 = gate.admit(Some(ip("10.0.0.1")), None);
        let _a2 = gate.admit(Some(ip("10.0.0.1")), None);
        let _b1 = gate.admit(Some(ip("10.0.0.2")), None);
        assert_eq!(gate.held(ip("10.0.0.1")), (3, 2));
        let _a3 = gate.admit(Some(ip("10.0.0.1")), None);
        assert_eq!(gate.held(ip("10.0.0.1")), (3, 2), "a1 made room");
        assert_eq!(
            gate.held(ip("10.0.0.2")).1,
            1,
            "another address kept its own"
        );
        // a1 was closed already: its end changes nothing.
        drop(a1);
        assert_eq!(gate.held(ip("10.0.0.1")), (3, 2));
    }

    #[test]
    fn over_the_total_cap_the_oldest_of_all_goes_and_credentials_leave_the_count() {
        let gate = Gate::new(3, 3);
        let first = gate.admit(Some(ip("10.0.0.1")), None);
        let second = gate.admit(Some(ip("10.0.0.2")), None);
        let _third = gate.admit(Some(ip("10.0.0.3")), None);
        let _fourth = gate.admit(Some(ip("10.0.0.4")), None);
        assert_eq!(gate.held(ip("10.0.0.1")), (3, 0), "the oldest made room");
        assert_eq!(gate.held(ip("10.0.0.4")).1, 1);
        // An authenticated connection leaves the count, once.
        second.release();
        second.release();
        assert_eq!(gate.held(ip("10.0.0.2")), (2, 0));
        drop(second);
        drop(first);
        assert_eq!(gate.held(ip("10.0.0.3")), (2, 1));
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64_and_a_mapped_ipv4_as_itself() {
        assert_eq!(
            counted_as(ip("2001:db8:1:2:aaaa::1")),
            counted_as(ip("2001:db8:1:2:bbbb::2"))
        );
        assert_ne!(
            counted_as(ip("2001:db8:1:2::1")),
            counted_as(ip("2001:db8:1:3::1"))
        );
        assert_eq!(counted_as(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
        let gate = Gate::new(10, 1);
        let _a = gate.admit(Some(ip("2001:db8::1")), None);
        let _b = gate.admit(Some(ip("2001:db8::2")), None);
        assert_eq!(gate.held(ip("2001:db8::3")), (1, 1));
    }

    #[test]
    fn a_connection_over_a_cap_is_shut_down() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let client = TcpStream::connect(at).unwrap();
        let (server_side, peer) = listener.accept().unwrap();
        let gate = Gate::new(1, 1);
        let _old = gate.admit(Some(peer.ip()), Some(Arc::new(server_side)));
        let _new = gate.admit(Some(peer.ip()), None);
        client
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut byte = [0u8; 1];
        let read = std::io::Read::read(&mut &client, &mut byte);
        assert!(
            matches!(read, Ok(0))
                || read.is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::TimedOut),
            "the old connection was ended"
        );
    }
}
