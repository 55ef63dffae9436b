//! Integration tests of the engines against the real host.

mod container;
mod files;
mod isolate;
mod subprocess;
mod warm;
