//! Integration tests of the E2B-compatible API on a live server (loopback only):
//! E2B's own SDKs against a whole node (`sdk`, the scripts in `tests/sdk`), and plain
//! HTTP requests for what they never send (strangers' requests, stalled bodies, other
//! spellings of a port).

mod admission;
mod caps;
mod downgrade;
mod files;
mod ingress;
mod input;
mod live;
mod metrics;
mod processes;
mod sdk;
mod templates;
mod walls;
