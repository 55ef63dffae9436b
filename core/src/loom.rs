//! The sync shim: `loom`'s types under `cfg(loom)`, std's otherwise.
//!
//! Everything in this crate whose correctness depends on interleavings routes its
//! atomics and locks through here, so that the loom models check the real code.

#[cfg(loom)]
pub(crate) use loom::sync;

/// std's synchronization types, under the names loom uses.
#[cfg(not(loom))]
pub(crate) mod sync {
    pub(crate) use std::sync::Arc;
    pub(crate) use std::sync::Mutex;

    /// Atomics.
    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::{AtomicU8, Ordering};
    }
}
