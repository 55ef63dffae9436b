//! Integration tests of the engines against the real host.

mod isolate;
mod subprocess;
mod warm;
