//! Loom model: concurrent destroys and an operation. The teardown runs exactly once,
//! after the operation finished, and every destroy returns only after it.

use super::*;
use crate::loom::sync::atomic::{AtomicUsize, Ordering};
use crate::loom::sync::Arc;
use loom::thread;

fn destroy(l: &Lifecycle, teardowns: &AtomicUsize, op_done: &AtomicUsize) {
    match l.begin_destroy() {
        DestroyRole::Leader => {
            loom::future::block_on(l.ops_drained());
            // No admitted operation may still be running now.
            assert_eq!(l.running(), 0);
            let _ = op_done.load(Ordering::SeqCst);
            teardowns.fetch_add(1, Ordering::SeqCst);
            l.finish_destroy();
        }
        DestroyRole::Follower => loom::future::block_on(l.destroyed()),
    }
    assert_eq!(l.phase(), Phase::Destroyed);
    assert_eq!(
        teardowns.load(Ordering::SeqCst),
        1,
        "destroy returned before the teardown"
    );
}

#[test]
fn concurrent_destroy_runs_the_teardown_once_after_operations() {
    loom::model(|| {
        let l = Arc::new(Lifecycle::new());
        let teardowns = Arc::new(AtomicUsize::new(0));
        let op_done = Arc::new(AtomicUsize::new(0));
        let op = {
            let (l, teardowns, op_done) = (l.clone(), teardowns.clone(), op_done.clone());
            thread::spawn(move || {
                if let Some(guard) = l.enter() {
                    // The teardown must not have run while this operation is admitted.
                    assert_eq!(teardowns.load(Ordering::SeqCst), 0);
                    op_done.store(1, Ordering::SeqCst);
                    drop(guard);
                }
            })
        };
        let other = {
            let (l, teardowns, op_done) = (l.clone(), teardowns.clone(), op_done.clone());
            thread::spawn(move || destroy(&l, &teardowns, &op_done))
        };
        destroy(&l, &teardowns, &op_done);
        op.join().unwrap();
        other.join().unwrap();
        assert!(l.enter().is_none());
    });
}
