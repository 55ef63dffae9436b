//! Integration tests of the conformance suite, in one binary.

mod broken;
mod isolate;
mod subprocess;
mod warm;
