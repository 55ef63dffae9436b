//! A sandbox's leases, as far as what it prepared ahead of need is concerned: runners
//! started for no tenant that a lease leaves unused for a while are retired, so that
//! an open, idle sandbox holds no interpreter.
//!
//! One task at most waits per sandbox, however many leases come and go (a pooled
//! instance runs one lease per execution): it sleeps until the current lease is due,
//! and follows the newest lease when others began meanwhile.

use std::sync::Arc;
use std::time::Duration;

// tokio's clock, which tests can pause and advance.
use tokio::time::Instant;

/// When the current lease began, and whether a task waits for it.
#[derive(Debug, Default)]
pub(crate) struct LeaseClock {
    state: parking_lot::Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Leases begun so far.
    lease: u64,
    /// When the current one began; `None` between leases.
    since: Option<Instant>,
    /// Whether a task waits for the current lease to come due.
    waiting: bool,
}

impl LeaseClock {
    /// A lease begins: `retire` runs `after` into it, unless it ended first. Needs a
    /// tokio runtime; without one nothing is retired. `retire` must be the same for
    /// every lease of the clock: a task already waiting keeps the one it has.
    pub(crate) fn leased(
        self: &Arc<Self>,
        after: Duration,
        retire: impl Fn() + Send + Sync + 'static,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut s = self.state.lock();
            s.lease += 1;
            s.since = Some(Instant::now());
            if s.waiting {
                // The waiting task follows this lease.
                return;
            }
            s.waiting = true;
        }
        let clock = self.clone();
        runtime.spawn(async move {
            // A task dropped while it waits (its runtime shut down) lets the next
            // lease start another.
            let mut guard = Waiting {
                clock: clock.clone(),
                armed: true,
            };
            loop {
                let (lease, due) = {
                    let mut s = clock.state.lock();
                    match s.since {
                        Some(since) => (s.lease, since + after),
                        None => {
                            s.waiting = false;
                            guard.armed = false;
                            return;
                        }
                    }
                };
                tokio::time::sleep_until(due).await;
                let current = {
                    let s = clock.state.lock();
                    s.since.is_some() && s.lease == lease
                };
                if current {
                    retire();
                    let mut s = clock.state.lock();
                    if s.lease == lease {
                        // Nothing began since: done until the next lease.
                        s.waiting = false;
                        guard.armed = false;
                        return;
                    }
                }
                // Another lease began (or this one ended): follow the newest.
            }
        });
    }

    /// The lease ends (the sandbox is recycled): its retirement is off.
    pub(crate) fn ended(&self) {
        self.state.lock().since = None;
    }

    /// Whether a lease is on now.
    pub(crate) fn in_lease(&self) -> bool {
        self.state.lock().since.is_some()
    }
}

/// Clears `waiting` when the waiting task is dropped before it ends by itself (its
/// runtime shut down); an ending task clears it under the lock it decided under.
struct Waiting {
    clock: Arc<LeaseClock>,
    armed: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.armed {
            self.clock.state.lock().waiting = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counter() -> (Arc<AtomicUsize>, impl Fn() + Send + Sync + 'static) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        (n, move || {
            m.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_left_alone_is_retired_once_when_due() {
        let clock = Arc::new(LeaseClock::default());
        let (n, retire) = counter();
        clock.leased(Duration::from_secs(10), retire);
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(n.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(n.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(n.load(Ordering::SeqCst), 1, "once");
        assert!(!clock.state.lock().waiting);
    }

    #[tokio::test(start_paused = true)]
    async fn leases_that_end_in_time_retire_nothing_and_one_task_follows_them_all() {
        let clock = Arc::new(LeaseClock::default());
        let (n, retire) = counter();
        let retire = Arc::new(retire);
        for _ in 0..1000 {
            let r = retire.clone();
            clock.leased(Duration::from_secs(10), move || r());
            tokio::time::sleep(Duration::from_millis(5)).await;
            clock.ended();
        }
        // One task waited for them all, and left once no lease was open.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(n.load(Ordering::SeqCst), 0);
        assert!(!clock.state.lock().waiting);
        // A later lease that is left alone is retired, 10 s after it began (not
        // after an earlier one).
        let r = retire.clone();
        clock.leased(Duration::from_secs(10), move || r());
        tokio::time::sleep(Duration::from_secs(5)).await;
        let r = retire.clone();
        clock.ended();
        clock.leased(Duration::from_secs(10), move || r());
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(n.load(Ordering::SeqCst), 0, "the second lease is 6 s old");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }
}
