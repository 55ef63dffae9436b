//! Integration tests of the conformance suite, in one binary.

mod broken;
mod container;
mod isolate;
mod plugged;
mod subprocess;
mod warm;
