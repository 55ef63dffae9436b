//! An engine's `create` in a task of its own, so that a caller who goes away
//! midway (cancelled, timed out, or stopped with the pool) never abandons a
//! half-made sandbox.
//!
//! An engine makes a sandbox in steps, some of them on blocking threads (a
//! workdir, a cgroup, a network namespace, a container). Dropping `create`'s
//! future between two steps would leave what the finished steps made with nobody
//! to remove it until the engine itself goes. Here the task always runs to its
//! end: its sandbox goes to the caller who waits for it, or, when that caller is
//! gone, is destroyed by the task, counted in the pool's `destroying` count until
//! then (the facade's shutdown waits for that count).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use paddock_core::{Engine, Error, ErrorCode, Sandbox, SandboxSpec};
use tokio::sync::oneshot;

use crate::engine_actor::caught;

/// The caller still waits for the sandbox.
const WAITING: u8 = 0;
/// The task handed its result over.
const DELIVERED: u8 = 1;
/// The caller went away first: the task disposes of the sandbox.
const ABANDONED: u8 = 2;

type Made = Result<Arc<dyn Sandbox>, Error>;

/// Starts `engine.create(spec)` in a task of its own (see the module docs);
/// `destroying` counts a sandbox whose caller went away until it is destroyed.
pub(crate) fn create(
    engine: Arc<dyn Engine>,
    spec: SandboxSpec,
    destroying: Arc<AtomicUsize>,
) -> Creation {
    let state = Arc::new(AtomicU8::new(WAITING));
    let (tx, rx) = oneshot::channel();
    let task_state = state.clone();
    let task_destroying = destroying.clone();
    tokio::spawn(async move {
        let made = caught("create", async move { engine.create(&spec).await }).await;
        let handed = task_state
            .compare_exchange(WAITING, DELIVERED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if handed {
            // A receiver dropped after the exchange drops the sandbox with it,
            // which tears it down (every engine's sandbox does on drop).
            let _ = tx.send(made);
        } else {
            // Uncounted when this ends, however it ends (a panic in destroy, or the
            // runtime dropping the task).
            let _counted = Uncount(task_destroying);
            if let Ok(sandbox) = made {
                let destroyed = caught("destroy", async move { sandbox.destroy().await }).await;
                if let Err(e) = destroyed {
                    tracing::warn!(error = %e, "destroying a sandbox whose caller went away");
                }
            }
        }
    });
    Creation {
        rx,
        state,
        destroying,
    }
}

/// The caller's end of [`create`]: resolves to the sandbox; dropped first, it
/// leaves the sandbox to the task to destroy.
pub(crate) struct Creation {
    rx: oneshot::Receiver<Made>,
    state: Arc<AtomicU8>,
    destroying: Arc<AtomicUsize>,
}

impl Future for Creation {
    type Output = Made;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Made> {
        let answer = std::task::ready!(Pin::new(&mut self.rx).poll(cx));
        Poll::Ready(answer.unwrap_or_else(|_| {
            // The task was dropped unfinished (its runtime stopped): nothing is
            // left for it to destroy, so this end's drop must not count one.
            self.state.store(DELIVERED, Ordering::Release);
            Err(Error::new(
                ErrorCode::EngineFailed,
                "creating the instance stopped before it finished (the scheduler is shutting down)",
            ))
        }))
    }
}

/// Takes one off the count it holds when dropped.
struct Uncount(Arc<AtomicUsize>);

impl Drop for Uncount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Creation {
    fn drop(&mut self) {
        // Delivered (the usual end): nothing to count.
        if self.state.load(Ordering::Acquire) != WAITING {
            return;
        }
        // Counted before the exchange, so that the task's decrement never comes
        // first.
        self.destroying.fetch_add(1, Ordering::AcqRel);
        let abandoned = self
            .state
            .compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if !abandoned {
            self.destroying.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl std::fmt::Debug for Creation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Creation")
            .field("state", &self.state.load(Ordering::Relaxed))
            .finish()
    }
}
