//! A cancellation token with exactly one terminal state.
//!
//! A token starts `Live` and moves once, to `Cancelled` (someone asked to stop) or to
//! `Finished` (the work completed first). The two transitions race, and exactly one of
//! them wins: an engine calls [`CancelToken::finish`] when its program has exited and,
//! if that returns `false`, reports the execution as cancelled, never as a clean
//! success. The loom model in `tests/loom_cancel.rs` checks this under every
//! interleaving.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::loom::sync::atomic::{AtomicU8, Ordering};
use crate::loom::sync::{Arc, Mutex};

const LIVE: u8 = 0;
const CANCELLED: u8 = 1;
const FINISHED: u8 = 2;

/// The state of a [`CancelToken`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenState {
    /// Neither cancelled nor finished.
    Live,
    /// Cancelled before the work finished.
    Cancelled,
    /// The work finished before any cancel.
    Finished,
}

struct Waiters {
    next_key: u64,
    list: Vec<(u64, Waker)>,
}

struct Inner {
    state: AtomicU8,
    waiters: Mutex<Waiters>,
}

/// A cloneable cancellation token; all clones share one state.
#[derive(Clone)]
pub struct CancelToken {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken")
            .field("state", &self.state())
            .finish()
    }
}

impl Default for CancelToken {
    fn default() -> Self {
        CancelToken::new()
    }
}

impl CancelToken {
    /// A live token.
    pub fn new() -> CancelToken {
        CancelToken {
            inner: Arc::new(Inner {
                state: AtomicU8::new(LIVE),
                waiters: Mutex::new(Waiters {
                    next_key: 0,
                    list: Vec::new(),
                }),
            }),
        }
    }

    /// Requests cancellation. Returns `true` if this call moved the token from `Live`
    /// to `Cancelled`; `false` if it was already cancelled or already finished.
    pub fn cancel(&self) -> bool {
        let won = self.transition(CANCELLED);
        if won {
            let wakers = std::mem::take(&mut self.lock().list);
            for (_, waker) in wakers {
                waker.wake();
            }
        }
        won
    }

    /// Marks the work finished. Returns `true` if this call moved the token from `Live`
    /// to `Finished`; `false` means a cancel won the race and the work must be
    /// reported as cancelled.
    pub fn finish(&self) -> bool {
        let won = self.transition(FINISHED);
        if won {
            // Nobody will ever be woken: drop the registrations.
            self.lock().list.clear();
        }
        won
    }

    /// The current state.
    pub fn state(&self) -> TokenState {
        match self.inner.state.load(Ordering::Acquire) {
            LIVE => TokenState::Live,
            CANCELLED => TokenState::Cancelled,
            _ => TokenState::Finished,
        }
    }

    /// Whether the token was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.state() == TokenState::Cancelled
    }

    /// A future that resolves when the token is cancelled. It never resolves if the
    /// token finishes instead.
    pub fn cancelled(&self) -> Cancelled<'_> {
        Cancelled {
            token: self,
            key: None,
        }
    }

    fn transition(&self, to: u8) -> bool {
        self.inner
            .state
            .compare_exchange(LIVE, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    fn lock(&self) -> impl std::ops::DerefMut<Target = Waiters> + '_ {
        // A poisoned waiter list only holds wakers; keep using it.
        match self.inner.waiters.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// Future returned by [`CancelToken::cancelled`].
#[derive(Debug)]
pub struct Cancelled<'a> {
    token: &'a CancelToken,
    key: Option<u64>,
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let token = self.token;
        let mut waiters = token.lock();
        // Checked under the lock: `cancel` swaps the state before it takes the lock,
        // so either we see CANCELLED here or our waker is in the list it drains.
        match token.inner.state.load(Ordering::Acquire) {
            CANCELLED => return Poll::Ready(()),
            FINISHED => return Poll::Pending,
            _ => {}
        }
        match self.key {
            Some(key) => {
                if let Some(slot) = waiters.list.iter_mut().find(|(k, _)| *k == key) {
                    if !slot.1.will_wake(cx.waker()) {
                        slot.1 = cx.waker().clone();
                    }
                } else {
                    waiters.list.push((key, cx.waker().clone()));
                }
            }
            None => {
                let key = waiters.next_key;
                waiters.next_key += 1;
                waiters.list.push((key, cx.waker().clone()));
                drop(waiters);
                self.key = Some(key);
            }
        }
        Poll::Pending
    }
}

impl Drop for Cancelled<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.token.lock().list.retain(|(k, _)| *k != key);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_terminal_state() {
        let t = CancelToken::new();
        assert_eq!(t.state(), TokenState::Live);
        assert!(t.finish());
        assert!(!t.cancel());
        assert_eq!(t.state(), TokenState::Finished);

        let t = CancelToken::new();
        assert!(t.clone().cancel());
        assert!(!t.finish());
        assert!(!t.cancel());
        assert!(t.is_cancelled());
    }

    #[tokio::test]
    async fn cancelled_future_wakes_and_dropped_waiters_unregister() {
        let t = CancelToken::new();
        for _ in 0..100 {
            let fut = t.cancelled();
            let r = tokio::time::timeout(std::time::Duration::from_millis(1), fut).await;
            assert!(r.is_err());
        }
        assert!(
            t.lock().list.is_empty(),
            "dropped futures left wakers behind"
        );
        let t2 = t.clone();
        let waiter = tokio::spawn(async move { t2.cancelled().await });
        tokio::task::yield_now().await;
        assert!(t.cancel());
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("waiter was not woken")
            .unwrap();
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_cancel.rs"]
mod loom_cancel;
