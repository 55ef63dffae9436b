//! The tests of the scheduler and its HTTP API with the built-in engines, in one
//! binary (one link instead of three): the egress allowlists, the HTTP API end to end,
//! and the scheduler through its handle and messages. (The pool crate's own tests
//! cover its audit log, limiter and policy stage.)

mod egress;
mod http;
mod scheduler;
