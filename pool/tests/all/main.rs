//! The pool crate's integration tests that need no engine, in one binary: the audit
//! log, the limiter and the policy stage. (The scheduler and the HTTP API run real
//! engines: their tests are the `paddock` crate's.)

mod audit;
mod limiter;
mod policy;
