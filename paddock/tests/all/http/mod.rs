//! The HTTP API end to end: a real server on a loopback port per test, driven by a
//! small HTTP/1.1 client over TCP.

mod client;
mod support;

mod admission;
mod allowlists;
mod concurrency;
mod errors;
mod executions;
mod idempotency;
mod interactive;
mod malformed;
mod openapi;
mod operations;
mod sandboxes;
mod strangers;
mod streaming;
mod tenants;
