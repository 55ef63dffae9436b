//! The record path does not allocate once a label combination has been seen.
//!
//! A counting global allocator counts the allocations of the thread that asks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use paddock_telemetry::{labels, Telemetry};

use crate::prom::value;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: thread-locals may be gone while a thread exits.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    COUNT.with(|c| c.get())
}

#[test]
fn the_counter_sees_allocations() {
    assert!(allocations(|| drop(std::hint::black_box(vec![1u8; 64]))) >= 1);
}

#[test]
fn recording_known_label_values_does_not_allocate() {
    let t = Telemetry::prometheus().unwrap();
    let record = |i: u32| {
        t.record_execution("subprocess", labels::outcome::COMPLETED);
        t.record_duration("subprocess", labels::outcome::COMPLETED, f64::from(i));
        t.record_pool_acquisition("subprocess", labels::acquire::OK);
        t.record_kill(labels::kill::TIMEOUT);
    };
    // The first record of a label combination inserts it into the SDK's map.
    record(0);
    let n = allocations(|| (1..=1000).for_each(record));
    assert_eq!(n, 0, "the record path allocated {n} times in 1000 rounds");

    let text = t.render_prometheus();
    assert_eq!(
        value(
            &text,
            "paddock_executions_total",
            &[("engine", "subprocess")]
        ),
        Some(1001.0)
    );
}
