//! Every integration test of the pool crate, in one binary (one link instead of five):
//! the audit log, the limiter, the policy stage, the scheduler through its handle and
//! messages, and the HTTP API end to end.

mod audit;
mod egress;
mod http;
mod limiter;
mod policy;
mod scheduler;
