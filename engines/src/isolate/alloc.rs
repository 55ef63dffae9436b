//! The allocator of an isolate's runtime: libc's malloc behind a byte meter.
//!
//! QuickJS's own memory limit turns an allocation failure into a catchable
//! `InternalError`, so a script that catches it would look like it succeeded. The
//! meter refuses allocations past the limit itself and remembers that it did, so the
//! execution is reported as `MEMORY_EXCEEDED` whatever the script does with the error.
//! It also records the peak, which becomes the result's `peak_memory_bytes`.

// rquickjs's `Allocator` is an `unsafe` trait over raw `malloc`/`free` pointers;
// implementing it cannot be done in safe code.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ptr;
use std::rc::Rc;

use rquickjs::allocator::Allocator;

/// Byte accounting shared by the allocator and the worker thread that owns the runtime.
#[derive(Debug, Default)]
pub(super) struct Meter {
    used: Cell<usize>,
    peak: Cell<usize>,
    limit: Cell<usize>,
    refused: Cell<bool>,
}

impl Meter {
    pub(super) fn new(limit: usize) -> Rc<Meter> {
        let meter = Meter::default();
        meter.limit.set(limit);
        Rc::new(meter)
    }

    /// Sets the limit for the next execution and starts a new peak and refusal record.
    pub(super) fn arm(&self, limit: usize) {
        self.limit.set(limit);
        self.peak.set(self.used.get());
        self.refused.set(false);
    }

    /// Bytes in use now.
    #[cfg(test)]
    pub(super) fn used(&self) -> usize {
        self.used.get()
    }

    /// The highest use since [`Meter::arm`].
    pub(super) fn peak(&self) -> usize {
        self.peak.get()
    }

    /// Whether an allocation was refused since [`Meter::arm`].
    pub(super) fn refused(&self) -> bool {
        self.refused.get()
    }

    /// Whether `grow` more bytes fit; records a refusal when they do not.
    fn admit(&self, grow: usize) -> bool {
        if self.used.get().saturating_add(grow) > self.limit.get() {
            self.refused.set(true);
            return false;
        }
        true
    }

    fn add(&self, n: usize) {
        let used = self.used.get() + n;
        self.used.set(used);
        if used > self.peak.get() {
            self.peak.set(used);
        }
    }

    fn sub(&self, n: usize) {
        self.used.set(self.used.get().saturating_sub(n));
    }
}

/// The allocator handed to `Runtime::new_with_alloc`.
pub(super) struct MeteredAlloc(pub(super) Rc<Meter>);

// SAFETY: every pointer comes from libc's malloc family, which returns memory aligned
// for any fundamental type (at least `usize`) or null; `usable_size` asks the same
// allocator about its own pointers.
unsafe impl Allocator for MeteredAlloc {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        if !self.0.admit(size) {
            return ptr::null_mut();
        }
        // SAFETY: plain malloc; a null result is passed on.
        let p = unsafe { libc::malloc(size.max(1)) }.cast::<u8>();
        if !p.is_null() {
            // SAFETY: `p` was just returned by malloc.
            self.0.add(unsafe { Self::usable_size(p) });
        }
        p
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        let Some(total) = count.checked_mul(size) else {
            return ptr::null_mut();
        };
        if !self.0.admit(total) {
            return ptr::null_mut();
        }
        // SAFETY: plain calloc; a null result is passed on.
        let p = unsafe { libc::calloc(count.max(1), size.max(1)) }.cast::<u8>();
        if !p.is_null() {
            // SAFETY: `p` was just returned by calloc.
            self.0.add(unsafe { Self::usable_size(p) });
        }
        p
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        // SAFETY: the caller passes a pointer from this allocator.
        self.0.sub(unsafe { Self::usable_size(ptr) });
        // SAFETY: as above.
        unsafe { libc::free(ptr.cast()) };
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        if ptr.is_null() {
            return self.alloc(new_size);
        }
        // SAFETY: the caller passes a pointer from this allocator.
        let old = unsafe { Self::usable_size(ptr) };
        if new_size > old && !self.0.admit(new_size - old) {
            return ptr::null_mut();
        }
        // SAFETY: as above; on failure the old block stays valid and counted.
        let p = unsafe { libc::realloc(ptr.cast(), new_size.max(1)) }.cast::<u8>();
        if !p.is_null() {
            self.0.sub(old);
            // SAFETY: `p` was just returned by realloc.
            self.0.add(unsafe { Self::usable_size(p) });
        }
        p
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        // SAFETY: the caller passes a pointer from libc's malloc family.
        unsafe { libc::malloc_usable_size(ptr.cast()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_limit_and_records_it() {
        let meter = Meter::new(1 << 20);
        let mut alloc = MeteredAlloc(meter.clone());
        let a = alloc.alloc(512 << 10);
        assert!(!a.is_null());
        assert!(meter.used() >= 512 << 10);
        assert!(!meter.refused());
        let b = alloc.alloc(768 << 10);
        assert!(b.is_null(), "past the limit");
        assert!(meter.refused());
        // SAFETY: `a` came from this allocator.
        let a = unsafe { alloc.realloc(a, 900 << 10) };
        assert!(!a.is_null(), "growing within the limit works");
        let peak = meter.peak();
        assert!(peak >= 900 << 10);
        // SAFETY: as above.
        unsafe { alloc.dealloc(a) };
        assert_eq!(meter.used(), 0);
        meter.arm(2 << 20);
        assert!(!meter.refused());
        assert_eq!(meter.peak(), 0);
    }
}
