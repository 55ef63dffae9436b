//! The sync shim: `loom`'s types under `cfg(loom)`, std's otherwise.
//!
//! Everything in Paddock whose correctness depends on interleavings routes its atomics
//! and locks through here, so that the loom models check the real code. Other Paddock
//! crates use it too (`paddock_core::loom::sync`).

#[cfg(loom)]
pub use loom::sync;

/// std's synchronization types, under the names loom uses.
#[cfg(not(loom))]
pub mod sync {
    pub use std::sync::Arc;
    pub use std::sync::Mutex;

    /// Atomics.
    pub mod atomic {
        pub use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
    }
}
