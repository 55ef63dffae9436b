//! Adaptive spin-before-park for calls from other threads.
//!
//! A call from another thread costs two thread hand-offs: waking the actor thread,
//! and waking the caller when the answer is ready. On small VMs a wake-up costs
//! 20–45 µs, more than a no-op execution takes. When answers have recently come back
//! fast, a caller polls for the answer for a short budget before it parks, saving the
//! second wake-up; as soon as an answer takes longer than the budget, spinning is
//! switched off for the next calls, so slow executions never burn CPU waiting, until
//! an answer comes back within the budget again.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Calls that skip spinning after one answer took longer than the budget.
const COOL_DOWN: u32 = 64;

/// An adaptive spin-before-park policy, shared by the callers that use it (for
/// example the clones of one `Paddock` handle, or one isolate's executions).
#[derive(Debug)]
pub struct Spin {
    budget: Duration,
    skip: AtomicU32,
}

impl Spin {
    /// A policy that polls for up to `budget` before parking; zero never spins.
    pub fn new(budget: Duration) -> Spin {
        Spin {
            budget,
            skip: AtomicU32::new(0),
        }
    }

    /// Awaits `fut`, first polling it for up to the budget if recent answers were fast.
    pub async fn run<F: Future>(&self, fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        if self.budget.is_zero() {
            return fut.await;
        }
        let skip = self.skip.load(Ordering::Relaxed);
        if skip > 0 {
            let start = Instant::now();
            let v = fut.await;
            // An answer that came within the budget even while parked means answers
            // are fast again: spin for the next call.
            let fast = start.elapsed() <= self.budget;
            self.skip
                .store(if fast { 0 } else { skip - 1 }, Ordering::Relaxed);
            return v;
        }
        if let Some(v) = self.spin(fut.as_mut()) {
            return v;
        }
        // Too slow to be worth spinning for: park for this and the next calls.
        self.skip.store(COOL_DOWN, Ordering::Relaxed);
        fut.await
    }

    /// Polls `fut` with a no-op waker until it is ready or the budget is spent. A plain
    /// function, so that nothing non-`Send` is held across the caller's `.await`.
    fn spin<F: Future>(&self, mut fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let start = Instant::now();
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return Some(v);
            }
            if start.elapsed() >= self.budget {
                return None;
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fast_answers_are_taken_while_spinning_and_slow_ones_switch_it_off() {
        let spin = Spin::new(Duration::from_millis(5));
        assert_eq!(spin.run(std::future::ready(7)).await, 7);
        assert_eq!(spin.skip.load(Ordering::Relaxed), 0);
        spin.run(tokio::time::sleep(Duration::from_millis(20)))
            .await;
        assert_eq!(spin.skip.load(Ordering::Relaxed), COOL_DOWN);
        // The next call parks without spinning and counts down while answers stay
        // slow; one fast answer switches spinning back on.
        spin.run(tokio::time::sleep(Duration::from_millis(20)))
            .await;
        assert_eq!(spin.skip.load(Ordering::Relaxed), COOL_DOWN - 1);
        spin.run(std::future::ready(())).await;
        assert_eq!(spin.skip.load(Ordering::Relaxed), 0);
        let off = Spin::new(Duration::ZERO);
        assert_eq!(off.run(std::future::ready(1)).await, 1);
    }
}
