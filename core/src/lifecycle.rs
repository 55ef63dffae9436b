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
//! [`Lifecycle::destroy`] is the whole protocol for a sandbox that implements
//! [`Teardown`]: every engine's `Sandbox::destroy` is that one call.
//!
//! The loom model in `tests/loom_lifecycle.rs` checks this under concurrent destroys
//! and operations.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::error::{Error, Result};
use crate::loom::sync::Mutex;

/// How a sandbox tears itself down, for [`Lifecycle::destroy`].
pub trait Teardown: Sync {
    /// Tells running operations to stop: they see it, end their programs and
    /// return (a paused sandbox is thawed here, since frozen tasks cannot see it).
    /// Called once, by the destroy's leader, before it waits for them.
    fn stop_running(&self) -> impl Future<Output = ()> + Send;

    /// The orderly teardown (kill what is left, free resources), run once after
    /// every admitted operation has returned. Its error is what every `destroy`
    /// returns.
    fn teardown(&self) -> impl Future<Output = Result<()>> + Send;

    /// Everything at once, blocking and best effort: when the leader's `destroy` is
    /// dropped midway (so that followers are never left waiting), and from the
    /// `Drop` of a sandbox that was never destroyed
    /// ([`Lifecycle::teardown_unless_destroyed`]).
    fn teardown_now(&self);
}

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
    /// What the teardown failed with, for the followers.
    teardown_error: Option<Error>,
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
                teardown_error: None,
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

impl Lifecycle {
    /// The destroy protocol. The first caller leads: it calls
    /// [`Teardown::stop_running`], waits until every admitted operation has
    /// returned, runs [`Teardown::teardown`] and keeps its error. Every other caller
    /// waits for the leader and returns the same result. A leader dropped midway
    /// finishes with [`Teardown::teardown_now`]. Idempotent, and safe to call
    /// concurrently.
    pub async fn destroy<T: Teardown>(&self, sandbox: &T) -> Result<()> {
        match self.begin_destroy() {
            DestroyRole::Leader => {
                let mut unfinished = Unfinished {
                    lifecycle: self,
                    sandbox,
                    done: false,
                };
                sandbox.stop_running().await;
                self.ops_drained().await;
                let result = sandbox.teardown().await;
                lock(&self.state).teardown_error = result.as_ref().err().cloned();
                unfinished.done = true;
                self.finish_destroy();
                result
            }
            DestroyRole::Follower => {
                self.destroyed().await;
                match lock(&self.state).teardown_error.clone() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        }
    }

    /// For a sandbox's `Drop`: tears it down at once unless a destroy did.
    pub fn teardown_unless_destroyed<T: Teardown>(&self, sandbox: &T) {
        if self.phase() != Phase::Destroyed {
            sandbox.teardown_now();
        }
    }
}

/// Finishes a leader's teardown that was dropped midway.
struct Unfinished<'a, T: Teardown> {
    lifecycle: &'a Lifecycle,
    sandbox: &'a T,
    done: bool,
}

impl<T: Teardown> Drop for Unfinished<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            self.sandbox.teardown_now();
            self.lifecycle.finish_destroy();
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

    #[derive(Default)]
    struct Counting {
        stopped: std::sync::atomic::AtomicUsize,
        torn: std::sync::atomic::AtomicUsize,
        now: std::sync::atomic::AtomicUsize,
        fail: bool,
        gate: tokio::sync::Notify,
        wait_at_gate: bool,
    }

    impl Teardown for Counting {
        async fn stop_running(&self) {
            self.stopped
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }

        async fn teardown(&self) -> Result<()> {
            if self.wait_at_gate {
                self.gate.notified().await;
            }
            self.torn.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.fail {
                return Err(Error::new(
                    crate::ErrorCode::EngineFailed,
                    "the cgroup stayed",
                ));
            }
            Ok(())
        }

        fn teardown_now(&self) {
            self.now.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn count(a: &std::sync::atomic::AtomicUsize) -> usize {
        a.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn destroy_tears_down_once_and_every_caller_gets_its_error() {
        let l = std::sync::Arc::new(Lifecycle::new());
        let sb = std::sync::Arc::new(Counting {
            fail: true,
            ..Counting::default()
        });
        let op = l.enter().unwrap();
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let (l, sb) = (l.clone(), sb.clone());
                tokio::spawn(async move { l.destroy(&*sb).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(count(&sb.torn), 0, "the teardown waits for the operation");
        drop(op);
        for c in calls {
            let e = c.await.unwrap().unwrap_err();
            assert_eq!(e.message, "the cgroup stayed");
        }
        assert_eq!(count(&sb.stopped), 1);
        assert_eq!(count(&sb.torn), 1);
        assert_eq!(count(&sb.now), 0);
        assert!(
            l.destroy(&*sb).await.is_err(),
            "a later destroy says the same"
        );
        l.teardown_unless_destroyed(&*sb);
        assert_eq!(count(&sb.now), 0, "destroyed: nothing left for Drop");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_dropped_midway_finishes_at_once() {
        let l = std::sync::Arc::new(Lifecycle::new());
        let sb = std::sync::Arc::new(Counting {
            wait_at_gate: true,
            ..Counting::default()
        });
        let leader = {
            let (l, sb) = (l.clone(), sb.clone());
            tokio::spawn(async move { l.destroy(&*sb).await })
        };
        while l.phase() == Phase::Live {
            tokio::task::yield_now().await;
        }
        let follower = {
            let (l, sb) = (l.clone(), sb.clone());
            tokio::spawn(async move { l.destroy(&*sb).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        leader.abort();
        assert!(leader.await.unwrap_err().is_cancelled());
        follower.await.unwrap().unwrap();
        assert_eq!(count(&sb.now), 1, "the dropped leader tore down at once");
        assert_eq!(count(&sb.torn), 0);
        assert_eq!(l.phase(), Phase::Destroyed);
    }

    #[test]
    fn a_sandbox_never_destroyed_is_torn_down_by_drop() {
        let l = Lifecycle::new();
        let sb = Counting::default();
        l.teardown_unless_destroyed(&sb);
        assert_eq!(count(&sb.now), 1);
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_lifecycle.rs"]
mod loom_lifecycle;
