//! A sandbox's egress decisions, kept in a bounded ring from which each execution
//! takes those made while it ran.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paddock_core::egress::{EgressEvent, EgressVerdict, EgressVia};
use parking_lot::Mutex;

/// The live byte counters of one connection.
#[derive(Debug, Default)]
pub struct Counters {
    /// Bytes from the sandbox to the target.
    pub out: AtomicU64,
    /// Bytes from the target to the sandbox.
    pub r#in: AtomicU64,
    /// Whether the connection has ended.
    pub closed: AtomicBool,
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    event: EgressEvent,
    counters: Option<Arc<Counters>>,
}

#[derive(Debug, Default)]
struct Ring {
    next: u64,
    entries: VecDeque<Entry>,
    /// Events pushed out of the ring before anyone took them.
    lost: u64,
}

/// The bounded log of one gateway.
#[derive(Debug)]
pub struct EgressLog {
    ring: Mutex<Ring>,
    cap: usize,
}

/// Totals of a gateway's decisions since it opened.
#[derive(Debug, Default)]
pub struct Totals {
    /// Attempts admitted.
    pub allowed: AtomicU64,
    /// Attempts refused.
    pub denied: AtomicU64,
    /// Admitted attempts whose target could not be reached.
    pub failed: AtomicU64,
}

impl EgressLog {
    /// A log that keeps the last `cap` events.
    pub fn new(cap: usize) -> EgressLog {
        EgressLog {
            ring: Mutex::new(Ring::default()),
            cap: cap.max(1),
        }
    }

    /// Records `event`; `counters` are the connection's, read whenever the event is
    /// taken.
    pub fn push(&self, event: EgressEvent, counters: Option<Arc<Counters>>) {
        let mut ring = self.ring.lock();
        let seq = ring.next;
        ring.next += 1;
        if ring.entries.len() >= self.cap {
            ring.entries.pop_front();
            ring.lost += 1;
        }
        ring.entries.push_back(Entry {
            seq,
            event,
            counters,
        });
    }

    /// A mark: the events recorded from now on are those [`EgressLog::since`] gives.
    pub fn mark(&self) -> u64 {
        self.ring.lock().next
    }

    /// The events recorded since `mark`, their byte counts as they stand, and how many
    /// events of that span the ring no longer holds. Waits up to `settle` for the
    /// connections among them to end, so that a program's last bytes are counted.
    pub async fn since(&self, mark: u64, settle: Duration) -> (Vec<EgressEvent>, u64) {
        let until = tokio::time::Instant::now() + settle;
        loop {
            let open = {
                let ring = self.ring.lock();
                ring.entries.iter().any(|e| {
                    e.seq >= mark
                        && e.counters
                            .as_ref()
                            .is_some_and(|c| !c.closed.load(Ordering::Acquire))
                })
            };
            if !open || tokio::time::Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ring = self.ring.lock();
        let first_held = ring.entries.front().map_or(ring.next, |e| e.seq);
        let lost = first_held.saturating_sub(mark).min(ring.lost);
        let events = ring
            .entries
            .iter()
            .filter(|e| e.seq >= mark)
            .map(|e| {
                let mut ev = e.event.clone();
                if let Some(c) = &e.counters {
                    ev.bytes_out = c.out.load(Ordering::Relaxed);
                    ev.bytes_in = c.r#in.load(Ordering::Relaxed);
                }
                ev
            })
            .collect();
        (events, lost)
    }
}

/// A decision about to be recorded.
pub(crate) fn event(
    via: EgressVia,
    host: &str,
    port: u16,
    addr: Option<String>,
    verdict: EgressVerdict,
    reason: impl Into<String>,
) -> EgressEvent {
    EgressEvent {
        at_ms: paddock_core::unix_ms(),
        via,
        host: host.chars().take(253).collect(),
        port,
        addr,
        verdict,
        reason: reason.into(),
        bytes_out: 0,
        bytes_in: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(host: &str) -> EgressEvent {
        event(EgressVia::Dns, host, 53, None, EgressVerdict::Denied, "x")
    }

    #[tokio::test]
    async fn an_execution_takes_what_was_recorded_while_it_ran_and_the_ring_is_bounded() {
        let log = EgressLog::new(3);
        log.push(ev("before"), None);
        let mark = log.mark();
        let c = Arc::new(Counters::default());
        log.push(ev("conn"), Some(c.clone()));
        c.out.store(5, Ordering::Relaxed);
        c.r#in.store(7, Ordering::Relaxed);
        c.closed.store(true, Ordering::Release);
        let (events, lost) = log.since(mark, Duration::from_millis(100)).await;
        assert_eq!(lost, 0);
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].bytes_out, events[0].bytes_in), (5, 7));
        let mark = log.mark();
        for i in 0..5 {
            log.push(ev(&format!("h{i}")), None);
        }
        let (events, lost) = log.since(mark, Duration::ZERO).await;
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].host, "h2");
        assert_eq!(lost, 2);
    }

    #[tokio::test]
    async fn an_open_connection_is_waited_for_only_as_long_as_settle() {
        let log = EgressLog::new(8);
        let mark = log.mark();
        log.push(ev("open"), Some(Arc::new(Counters::default())));
        let t = std::time::Instant::now();
        let (events, _) = log.since(mark, Duration::from_millis(50)).await;
        assert_eq!(events.len(), 1);
        assert!(t.elapsed() >= Duration::from_millis(50));
    }
}
