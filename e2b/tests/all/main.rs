//! Integration tests of the E2B-compatible API on a live server (loopback only), with
//! plain HTTP requests: what E2B's SDKs do is covered by `cli/tests/e2b.rs`, and here
//! is what they never send (strangers' requests, stalled bodies, other spellings of a
//! port).

mod admission;
mod caps;
mod downgrade;
mod files;
mod ingress;
mod input;
mod live;
mod processes;
mod templates;
mod walls;
