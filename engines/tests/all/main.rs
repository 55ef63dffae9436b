//! Integration tests of the engines against the real host.

mod subprocess;
