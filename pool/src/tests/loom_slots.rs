//! Loom models of the pool's slot accounting.

use super::*;
use loom::thread;

fn check(slots: &Slots<u32>, max: usize) {
    let c = slots.counts();
    assert!(
        c.size() <= max,
        "size {} exceeds max {max}: {c:?}",
        c.size()
    );
}

/// Two callers race for one slot; one creates, the other waits and is handed the
/// instance on release, or aborts. Nothing is lost: at the end the instance is idle.
#[test]
fn acquire_release_abort_never_lose_a_slot() {
    loom::model(|| {
        let slots = Arc::new(Slots::<u32>::new(1, 2));
        let mut retired = Vec::new();
        assert!(matches!(
            slots.acquire(|_| true, &mut retired),
            Acquire::Create
        ));
        slots.created();

        let waiter = match slots.acquire(|_| true, &mut retired) {
            Acquire::Wait(w) => w,
            other => panic!("{other:?}"),
        };
        let releaser = {
            let slots = slots.clone();
            thread::spawn(move || {
                assert_eq!(slots.release(1), None);
            })
        };
        // The waiter gives up concurrently with the release.
        let back = slots.abort_waiter(&waiter);
        releaser.join().unwrap();
        assert_eq!(back, None);
        check(&slots, 1);
        let c = slots.counts();
        assert_eq!(
            c,
            SlotCounts {
                idle: 1,
                busy: 0,
                creating: 0,
                waiting: 0
            },
            "slot lost"
        );
    });
}

/// A waiter that keeps waiting is woken and gets the instance.
#[test]
fn a_waiting_caller_is_handed_the_released_instance() {
    loom::model(|| {
        let slots = Arc::new(Slots::<u32>::new(1, 1));
        let mut retired = Vec::new();
        assert!(matches!(
            slots.acquire(|_| true, &mut retired),
            Acquire::Create
        ));
        slots.created();
        let waiter = match slots.acquire(|_| true, &mut retired) {
            Acquire::Wait(w) => w,
            other => panic!("{other:?}"),
        };
        let releaser = {
            let slots = slots.clone();
            thread::spawn(move || {
                slots.release(9);
            })
        };
        let got = loom::future::block_on(std::future::poll_fn(|cx| slots.poll_waiter(&waiter, cx)));
        releaser.join().unwrap();
        assert_eq!(got, Some(9));
        assert_eq!(
            slots.counts(),
            SlotCounts {
                idle: 0,
                busy: 1,
                creating: 0,
                waiting: 0
            }
        );
    });
}

/// Concurrent acquire (creating), retire and create failure never exceed max_size,
/// and every reservation is accounted for.
#[test]
fn concurrent_create_retire_and_failure_respect_max() {
    loom::model(|| {
        let slots = Arc::new(Slots::<u32>::new(2, 0));
        let mut retired = Vec::new();
        assert!(matches!(
            slots.acquire(|_| true, &mut retired),
            Acquire::Create
        ));
        slots.created();
        let a = {
            let slots = slots.clone();
            thread::spawn(move || {
                let mut r = Vec::new();
                match slots.acquire(|_| true, &mut r) {
                    Acquire::Create => {
                        check(&slots, 2);
                        slots.create_failed();
                    }
                    Acquire::Full => {}
                    other => panic!("{other:?}"),
                }
            })
        };
        let b = {
            let slots = slots.clone();
            thread::spawn(move || {
                slots.retire_busy();
                check(&slots, 2);
            })
        };
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(slots.counts().size(), 0);
    });
}
