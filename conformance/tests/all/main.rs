//! Integration tests of the conformance suite, in one binary.

mod broken;
mod container;
mod isolate;
mod subprocess;
mod warm;
