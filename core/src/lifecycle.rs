//! A sandbox's life cycle: operations run while it is live; destroy is idempotent,
//! safe to call concurrently, waits for running operations, and runs the teardown
//! exactly once.
//!
//! ```text
//! Live ──first destroy()──▶ Destroying ──teardown done──▶ Destroyed
//! ```
//!
//! - [`Lifecycle::enter`] admits an operation only while `Live`; the returned guard
//!   keeps the destroy waiting until it is dropped.
//! - [`Lifecycle::begin_destroy`] tells exactly one caller that it leads the teardown;
//!   every other caller follows and waits until the leader calls
//!   [`Lifecycle::finish_destroy`]. When any `destroy` returns, the teardown is done.
//!
//! The loom model in `tests/loom_lifecycle.rs` checks this under concurrent destroys
//! and operations.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::loom::sync::Mutex;

/// The phase of a [`Lifecycle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Operations are admitted.
    Live,
    /// A destroy is under way; new operations are refused.
    Destroying,
    /// Torn down; everything is refused.
    Destroyed,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    ops: usize,
    waiters: Vec<Waker>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Lifecycle {
    state: Mutex<State>,
}

/// What [`Lifecycle::begin_destroy`] asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestroyRole {
    /// Run the teardown (after [`Lifecycle::ops_drained`]), then call
    /// [`Lifecycle::finish_destroy`].
    Leader,
    /// Wait for [`Lifecycle::destroyed`].
    Follower,
}

/// An admitted operation; the destroy waits until it is dropped.
#[derive(Debug)]
pub struct OpGuard<'a> {
    lifecycle: &'a Lifecycle,
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.lifecycle.state);
        s.ops -= 1;
        let wake = s.ops == 0 && s.phase != Phase::Live;
        let waiters = if wake {
            std::mem::take(&mut s.waiters)
        } else {
            Vec::new()
        };
        drop(s);
        for w in waiters {
            w.wake();
        }
    }
}

fn lock(m: &Mutex<State>) -> impl std::ops::DerefMut<Target = State> + '_ {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle::new()
    }
}

impl Lifecycle {
    /// A live life cycle with no operation running.
    pub fn new() -> Lifecycle {
        Lifecycle {
            state: Mutex::new(State {
                phase: Phase::Live,
                ops: 0,
                waiters: Vec::new(),
            }),
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        lock(&self.state).phase
    }

    /// Operations admitted and not yet finished.
    pub fn running(&self) -> usize {
        lock(&self.state).ops
    }

    /// Admits an operation, or `None` once a destroy has begun.
    pub fn enter(&self) -> Option<OpGuard<'_>> {
        let mut s = lock(&self.state);
        if s.phase != Phase::Live {
            return None;
        }
        s.ops += 1;
        Some(OpGuard { lifecycle: self })
    }

    /// Starts a destroy. Exactly one caller, ever, is the [`DestroyRole::Leader`].
    pub fn begin_destroy(&self) -> DestroyRole {
        let mut s = lock(&self.state);
        if s.phase == Phase::Live {
            s.phase = Phase::Destroying;
            DestroyRole::Leader
        } else {
            DestroyRole::Follower
        }
    }

    /// Resolves when no admitted operation is left.
    pub fn ops_drained(&self) -> impl Future<Output = ()> + '_ {
        Wait {
            lifecycle: self,
            done: |s: &State| s.ops == 0,
        }
    }

    /// Marks the teardown done and wakes every follower.
    pub fn finish_destroy(&self) {
        let mut s = lock(&self.state);
        s.phase = Phase::Destroyed;
        let waiters = std::mem::take(&mut s.waiters);
        drop(s);
        for w in waiters {
            w.wake();
        }
    }

    /// Resolves when the teardown is done.
    pub fn destroyed(&self) -> impl Future<Output = ()> + '_ {
        Wait {
            lifecycle: self,
            done: |s: &State| s.phase == Phase::Destroyed,
        }
    }
}

struct Wait<'a, F> {
    lifecycle: &'a Lifecycle,
    done: F,
}

impl<F: Fn(&State) -> bool + Unpin> Future for Wait<'_, F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = lock(&self.lifecycle.state);
        if (self.done)(&s) {
            return Poll::Ready(());
        }
        if !s.waiters.iter().any(|w| w.will_wake(cx.waker())) {
            s.waiters.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn destroy_waits_for_operations_and_runs_once() {
        let l = std::sync::Arc::new(Lifecycle::new());
        let op = l.enter().unwrap();
        assert_eq!(l.begin_destroy(), DestroyRole::Leader);
        assert_eq!(l.begin_destroy(), DestroyRole::Follower);
        assert!(l.enter().is_none(), "no new operation once destroying");
        let l2 = l.clone();
        let drained = tokio::spawn(async move { l2.ops_drained().await });
        tokio::task::yield_now().await;
        assert!(!drained.is_finished());
        drop(op);
        drained.await.unwrap();
        let l3 = l.clone();
        let follower = tokio::spawn(async move { l3.destroyed().await });
        tokio::task::yield_now().await;
        assert!(!follower.is_finished());
        l.finish_destroy();
        follower.await.unwrap();
        assert_eq!(l.phase(), Phase::Destroyed);
        assert!(l.enter().is_none());
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_lifecycle.rs"]
mod loom_lifecycle;
