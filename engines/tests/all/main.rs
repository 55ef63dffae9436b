//! Integration tests of the engines against the real host.

mod container;
mod isolate;
mod subprocess;
mod warm;
