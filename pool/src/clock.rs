//! Time as the scheduler sees it: a [`Clock`] trait with the real [`SystemClock`] and a
//! [`ManualClock`] that tests advance by hand, so no test ever sleeps through a window.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A source of time. The limiter reads [`Clock::now`] for windows and deadlines; the
/// audit log reads [`Clock::unix_ms`] for timestamps.
pub trait Clock: Send + Sync + fmt::Debug {
    /// A monotonic instant.
    fn now(&self) -> Instant;
    /// Wall-clock milliseconds since the Unix epoch.
    fn unix_ms(&self) -> u64;
}

/// A clock shared between the parts that read it.
pub type SharedClock = Arc<dyn Clock>;

/// The real clock: [`Instant::now`] and the system time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemClock;

impl SystemClock {
    /// The system clock as a [`SharedClock`].
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_ms(&self) -> u64 {
        paddock_core::unix_ms()
    }
}

/// A clock that moves only when told to. Both its readings advance together.
///
/// Share it with `Arc`: hand one clone to the code under test (as a [`SharedClock`])
/// and keep another to [`advance`](ManualClock::advance) it.
///
/// ```
/// use std::time::Duration;
/// use paddock_pool::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::shared();
/// let start = clock.now();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(clock.now() - start, Duration::from_millis(1500));
/// ```
#[derive(Debug)]
pub struct ManualClock {
    origin: Instant,
    origin_unix_ms: u64,
    elapsed_nanos: AtomicU64,
}

impl ManualClock {
    /// A clock standing at the current instant and wall time.
    pub fn new() -> ManualClock {
        ManualClock::starting_at_unix_ms(paddock_core::unix_ms())
    }

    /// A clock whose wall time starts at `unix_ms` (its instant is the current one).
    pub fn starting_at_unix_ms(unix_ms: u64) -> ManualClock {
        ManualClock {
            origin: Instant::now(),
            origin_unix_ms: unix_ms,
            elapsed_nanos: AtomicU64::new(0),
        }
    }

    /// A new clock in an `Arc`, ready to share.
    pub fn shared() -> Arc<ManualClock> {
        Arc::new(ManualClock::new())
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_nanos.fetch_add(nanos, Ordering::SeqCst);
    }

    /// How far the clock has been advanced in total.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_nanos.load(Ordering::SeqCst))
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.origin + self.elapsed()
    }

    fn unix_ms(&self) -> u64 {
        self.origin_unix_ms + self.elapsed().as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = Arc::new(ManualClock::starting_at_unix_ms(1_000));
        let shared: SharedClock = clock.clone();
        let t0 = shared.now();
        assert_eq!(shared.now(), t0);
        assert_eq!(shared.unix_ms(), 1_000);
        clock.advance(Duration::from_millis(250));
        assert_eq!(shared.now() - t0, Duration::from_millis(250));
        assert_eq!(shared.unix_ms(), 1_250);
        assert_eq!(clock.elapsed(), Duration::from_millis(250));
    }

    #[test]
    fn system_clock_is_monotonic() {
        let c = SystemClock::shared();
        let a = c.now();
        assert!(c.now() >= a);
        assert!(c.unix_ms() > 1_600_000_000_000);
    }
}
