//! The pool's slot accounting: idle instances, reservations for instances being
//! created, and a FIFO of waiters that an instance is handed to directly.
//!
//! Everything here is synchronous and lock-protected (through the loom shim), so the
//! loom models in `tests/loom_slots.rs` can check that, under every interleaving of
//! acquire, release, retire, create failure and waiter abort, the pool never holds
//! more than `max_size` instances and never loses one.

use std::collections::VecDeque;
use std::task::Waker;

use crate::loom::sync::{Arc, Mutex};

/// Counts of a pool's slots. `size = idle + busy + creating`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotCounts {
    /// Instances ready in the idle list.
    pub idle: usize,
    /// Instances leased out (running, recycling, or handed to a waiter).
    pub busy: usize,
    /// Instances being created.
    pub creating: usize,
    /// Callers waiting for an instance.
    pub waiting: usize,
}

impl SlotCounts {
    /// Instances that exist or are being created.
    pub fn size(&self) -> usize {
        self.idle + self.busy + self.creating
    }
}

/// What a caller should do after [`Slots::acquire`].
#[derive(Debug)]
pub enum Acquire<T> {
    /// An idle instance, now leased to the caller.
    Ready(T),
    /// Room to create a new instance: create it, then call [`Slots::created`] or
    /// [`Slots::create_failed`].
    Create,
    /// Queued: wait on the [`Waiter`] (and abort it if the caller gives up).
    Wait(Waiter<T>),
    /// No room and the wait queue is full.
    Full,
}

enum Cell<T> {
    Waiting(Option<Waker>),
    Handed(T),
    Taken,
    Aborted,
}

/// A queued caller's place. An instance released while it waits is handed to it
/// directly; if it aborts, a handed instance goes back to the pool.
pub struct Waiter<T> {
    cell: Arc<Mutex<Cell<T>>>,
}

impl<T> std::fmt::Debug for Waiter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").finish_non_exhaustive()
    }
}

struct State<T> {
    idle: VecDeque<T>,
    busy: usize,
    creating: usize,
    /// Queued callers; every cell here is `Waiting` (aborts remove themselves).
    waiters: VecDeque<Arc<Mutex<Cell<T>>>>,
    closed: bool,
}

/// The slot accounting of one pool.
pub struct Slots<T> {
    state: Mutex<State<T>>,
    max_size: usize,
    max_waiting: usize,
}

impl<T> std::fmt::Debug for Slots<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("counts", &self.counts())
            .field("max_size", &self.max_size)
            .field("max_waiting", &self.max_waiting)
            .finish()
    }
}

fn lock<U>(m: &Mutex<U>) -> impl std::ops::DerefMut<Target = U> + '_ {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl<T> Slots<T> {
    /// Empty accounting for a pool of at most `max_size` instances and `max_waiting`
    /// queued callers.
    pub fn new(max_size: usize, max_waiting: usize) -> Slots<T> {
        Slots {
            state: Mutex::new(State {
                idle: VecDeque::new(),
                busy: 0,
                creating: 0,
                waiters: VecDeque::new(),
                closed: false,
            }),
            max_size,
            max_waiting,
        }
    }

    /// The largest number of instances.
    pub fn max_size(&self) -> usize {
        self.max_size
    }

    /// Current counts (a consistent snapshot).
    pub fn counts(&self) -> SlotCounts {
        let s = lock(&self.state);
        SlotCounts {
            idle: s.idle.len(),
            busy: s.busy,
            creating: s.creating,
            waiting: s.waiters.len(),
        }
    }

    /// Takes an idle instance, reserves room to create one, or queues the caller.
    /// `accept` may reject an idle instance (too old, say); rejected ones are returned
    /// in `retired` and no longer count.
    pub fn acquire(&self, mut accept: impl FnMut(&T) -> bool, retired: &mut Vec<T>) -> Acquire<T> {
        let mut s = lock(&self.state);
        if s.closed {
            return Acquire::Full;
        }
        while let Some(item) = s.idle.pop_front() {
            if accept(&item) {
                s.busy += 1;
                return Acquire::Ready(item);
            }
            retired.push(item);
        }
        if s.idle.len() + s.busy + s.creating < self.max_size {
            s.creating += 1;
            return Acquire::Create;
        }
        if s.waiters.len() >= self.max_waiting {
            return Acquire::Full;
        }
        let cell = Arc::new(Mutex::new(Cell::Waiting(None)));
        s.waiters.push_back(cell.clone());
        Acquire::Wait(Waiter { cell })
    }

    /// Reserves room for a prewarmed instance if the pool is below `target` idle and
    /// has room; returns whether the caller should create one.
    pub fn reserve_prewarm(&self, target_idle: usize) -> bool {
        let mut s = lock(&self.state);
        if s.closed || s.idle.len() + s.creating >= target_idle {
            return false;
        }
        if s.idle.len() + s.busy + s.creating >= self.max_size {
            return false;
        }
        s.creating += 1;
        true
    }

    /// A reserved creation succeeded; the instance is leased to the creator.
    pub fn created(&self) {
        let mut s = lock(&self.state);
        s.creating -= 1;
        s.busy += 1;
    }

    /// A reserved creation failed; its room is free again. Returns whether a waiter
    /// is queued that should now try to create in its place.
    pub fn create_failed(&self) -> bool {
        let mut s = lock(&self.state);
        s.creating -= 1;
        !s.waiters.is_empty()
    }

    /// Returns a leased instance: handed to the first live waiter, or put idle.
    /// Returns the instance back if the pool is closed (the caller destroys it).
    pub fn release(&self, item: T) -> Option<T> {
        let mut s = lock(&self.state);
        s.busy -= 1;
        self.place(&mut s, item)
    }

    /// Puts a prewarmed instance (from [`Slots::reserve_prewarm`]) into the pool.
    pub fn add_prewarmed(&self, item: T) -> Option<T> {
        let mut s = lock(&self.state);
        s.creating -= 1;
        self.place(&mut s, item)
    }

    fn place(&self, s: &mut State<T>, item: T) -> Option<T> {
        if s.closed {
            return Some(item);
        }
        if let Some(cell) = s.waiters.pop_front() {
            let mut c = lock(&cell);
            if let Cell::Waiting(waker) = std::mem::replace(&mut *c, Cell::Handed(item)) {
                s.busy += 1;
                drop(c);
                if let Some(w) = waker {
                    w.wake();
                }
                return None;
            }
            unreachable!("only waiting cells are queued");
        }
        s.idle.push_back(item);
        None
    }

    /// A leased instance is gone for good (retired, destroyed, crashed). Returns
    /// whether a waiter is queued that should now create an instance in its place.
    pub fn retire_busy(&self) -> bool {
        let mut s = lock(&self.state);
        s.busy -= 1;
        !s.closed && !s.waiters.is_empty()
    }

    /// Takes a queued waiter's place to create an instance for it: if a live waiter
    /// exists and there is room, reserves creation and returns true.
    pub fn reserve_for_waiter(&self) -> bool {
        let mut s = lock(&self.state);
        if s.closed || s.waiters.is_empty() {
            return false;
        }
        if s.idle.len() + s.busy + s.creating >= self.max_size {
            return false;
        }
        s.creating += 1;
        true
    }

    /// Removes idle instances for which `expired` is true, keeping at least `min_idle`.
    pub fn reap_idle(&self, min_idle: usize, mut expired: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut s = lock(&self.state);
        let mut out = Vec::new();
        let mut keep = VecDeque::new();
        while let Some(item) = s.idle.pop_front() {
            if s.idle.len() + keep.len() >= min_idle && expired(&item) {
                out.push(item);
            } else {
                keep.push_back(item);
            }
        }
        s.idle = keep;
        out
    }

    /// Stops the pool: no more acquires; returns every idle instance for destruction
    /// and wakes every waiter (they see the pool closed).
    pub fn close(&self) -> Vec<T> {
        let mut s = lock(&self.state);
        s.closed = true;
        let waiters: Vec<_> = s.waiters.drain(..).collect();
        let idle = s.idle.drain(..).collect();
        drop(s);
        for cell in waiters {
            let mut c = lock(&cell);
            if let Cell::Waiting(w) = std::mem::replace(&mut *c, Cell::Aborted) {
                drop(c);
                if let Some(w) = w {
                    w.wake();
                }
            }
        }
        idle
    }

    /// Whether [`Slots::close`] was called.
    pub fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }

    /// Polls a waiter: `Ready(Some(item))` when handed an instance (now leased),
    /// `Ready(None)` when the pool closed, `Pending` otherwise.
    pub fn poll_waiter(
        &self,
        waiter: &Waiter<T>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        let mut c = lock(&waiter.cell);
        match std::mem::replace(&mut *c, Cell::Taken) {
            Cell::Handed(item) => std::task::Poll::Ready(Some(item)),
            Cell::Waiting(_) => {
                *c = Cell::Waiting(Some(cx.waker().clone()));
                std::task::Poll::Pending
            }
            Cell::Aborted => {
                *c = Cell::Aborted;
                std::task::Poll::Ready(None)
            }
            Cell::Taken => std::task::Poll::Ready(None),
        }
    }

    /// Gives up waiting. If an instance was handed over in the meantime it is
    /// released again (to the next waiter or idle); nothing is lost.
    pub fn abort_waiter(&self, waiter: &Waiter<T>) -> Option<T> {
        let handed = {
            // Same lock order as `place`: the state, then the cell.
            let mut s = lock(&self.state);
            let mut c = lock(&waiter.cell);
            match std::mem::replace(&mut *c, Cell::Aborted) {
                Cell::Handed(item) => Some(item),
                Cell::Waiting(_) => {
                    if let Some(pos) = s.waiters.iter().position(|w| Arc::ptr_eq(w, &waiter.cell)) {
                        s.waiters.remove(pos);
                    }
                    None
                }
                other => {
                    *c = other;
                    None
                }
            }
        };
        handed.and_then(|item| self.release(item))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::task::{Context, Poll};

    fn noop_cx() -> Context<'static> {
        Context::from_waker(std::task::Waker::noop())
    }

    #[test]
    fn grows_to_max_then_queues_then_refuses() {
        let slots: Slots<u32> = Slots::new(2, 1);
        let mut retired = Vec::new();
        assert!(matches!(
            slots.acquire(|_| true, &mut retired),
            Acquire::Create
        ));
        slots.created();
        assert!(matches!(
            slots.acquire(|_| true, &mut retired),
            Acquire::Create
        ));
        slots.created();
        let w = match slots.acquire(|_| true, &mut retired) {
            Acquire::Wait(w) => w,
            other => panic!("{other:?}"),
        };
        assert!(matches!(
            slots.acquire(|_| true, &mut retired),
            Acquire::Full
        ));
        assert_eq!(
            slots.counts(),
            SlotCounts {
                idle: 0,
                busy: 2,
                creating: 0,
                waiting: 1
            }
        );
        assert_eq!(slots.release(7), None);
        assert_eq!(slots.poll_waiter(&w, &mut noop_cx()), Poll::Ready(Some(7)));
        assert_eq!(
            slots.counts(),
            SlotCounts {
                idle: 0,
                busy: 2,
                creating: 0,
                waiting: 0
            }
        );
    }

    #[test]
    fn an_aborted_waiter_gives_back_what_it_was_handed() {
        let slots: Slots<u32> = Slots::new(1, 4);
        let mut retired = Vec::new();
        assert!(matches!(
            slots.acquire(|_| true, &mut retired),
            Acquire::Create
        ));
        slots.created();
        let Acquire::Wait(w1) = slots.acquire(|_| true, &mut retired) else {
            panic!()
        };
        let Acquire::Wait(w2) = slots.acquire(|_| true, &mut retired) else {
            panic!()
        };
        slots.release(1);
        // w1 was handed the instance but gives up: it goes on to w2.
        assert_eq!(slots.abort_waiter(&w1), None);
        assert_eq!(slots.poll_waiter(&w2, &mut noop_cx()), Poll::Ready(Some(1)));
        assert_eq!(slots.counts().busy, 1);
        // An aborted, queued waiter is skipped.
        let Acquire::Wait(w3) = slots.acquire(|_| true, &mut retired) else {
            panic!()
        };
        slots.abort_waiter(&w3);
        assert_eq!(slots.counts().waiting, 0);
        slots.release(1);
        assert_eq!(
            slots.counts(),
            SlotCounts {
                idle: 1,
                busy: 0,
                creating: 0,
                waiting: 0
            }
        );
    }

    #[test]
    fn rejected_idle_instances_are_retired_and_room_reused() {
        let slots: Slots<u32> = Slots::new(1, 0);
        assert!(slots.reserve_prewarm(1));
        assert!(!slots.reserve_prewarm(1));
        slots.add_prewarmed(5);
        let mut retired = Vec::new();
        assert!(matches!(
            slots.acquire(|&v| v != 5, &mut retired),
            Acquire::Create
        ));
        assert_eq!(retired, vec![5]);
        slots.create_failed();
        assert_eq!(slots.counts().size(), 0);
    }

    #[test]
    fn reap_keeps_min_idle_and_close_drains() {
        let slots: Slots<u32> = Slots::new(4, 4);
        for v in 0..4 {
            assert!(slots.reserve_prewarm(4));
            slots.add_prewarmed(v);
        }
        let reaped = slots.reap_idle(1, |_| true);
        assert_eq!(reaped.len(), 3);
        assert_eq!(slots.counts().idle, 1);
        let mut retired = Vec::new();
        let Acquire::Ready(v) = slots.acquire(|_| true, &mut retired) else {
            panic!()
        };
        let Acquire::Create = slots.acquire(|_| true, &mut retired) else {
            panic!()
        };
        slots.created();
        let Acquire::Create = slots.acquire(|_| true, &mut retired) else {
            panic!()
        };
        slots.created();
        let Acquire::Create = slots.acquire(|_| true, &mut retired) else {
            panic!()
        };
        slots.created();
        let Acquire::Wait(w) = slots.acquire(|_| true, &mut retired) else {
            panic!()
        };
        assert!(slots.close().is_empty());
        assert_eq!(slots.poll_waiter(&w, &mut noop_cx()), Poll::Ready(None));
        assert_eq!(
            slots.release(v),
            Some(v),
            "a closed pool hands instances back for destruction"
        );
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_slots.rs"]
mod loom_slots;
