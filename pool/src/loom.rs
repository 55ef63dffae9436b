//! The sync shim: `loom`'s types under `cfg(loom)`, std's otherwise.
//!
//! The pool's slot accounting ([`crate::slots`]) routes its locks through here, so
//! that the loom models check the real code.

#[cfg(loom)]
pub(crate) use loom::sync;

/// std's synchronization types, under the names loom uses.
#[cfg(not(loom))]
pub(crate) mod sync {
    pub(crate) use std::sync::Arc;
    pub(crate) use std::sync::Mutex;
}
