//! # paddock
//!
//! Paddock, the embeddable scheduler for running untrusted code, whole: the scheduler
//! of `paddock-pool` (policy, limiter, pools, streamer, audit, the [`Paddock`] handle
//! and the HTTP API) with the built-in engines of `paddock-engines` (subprocess,
//! QuickJS isolate, OCI container). [`builder()`] is the scheduler's builder over
//! the whole configuration ([`PaddockConfig`], the document every layer's section is
//! part of), with the built-in engines' registry ([`BuiltinEngines`]):
//!
//! ```no_run
//! # async fn demo() -> Result<(), paddock::core::Error> {
//! use paddock::core::{ExecRequest, Language, Program};
//!
//! let paddock = paddock::builder().start()?;
//! let result = paddock
//!     .execute(ExecRequest::new(Program::code(Language::Python, "print(6 * 7)")))
//!     .await?;
//! assert_eq!(result.stdout, "42\n");
//! paddock.shutdown(std::time::Duration::from_secs(5)).await?;
//! # Ok(()) }
//! ```
//!
//! The crates by layer, each usable alone: `paddock-core` (the vocabulary and the
//! engine contract), `paddock-engines` (the engines, and the host layer they stand
//! on), `paddock-pool` (the scheduler, which knows no engine type: it runs those
//! registered in code and those its [`EngineRegistry`] makes), `paddock-telemetry`.
//! This crate re-exports the scheduler's API and the three others as [`core`],
//! [`engines`] and [`telemetry`].
//!
//! [`node::Node`] is a whole node as `paddock serve` runs it: the scheduler with the
//! built-in engines, its fleet membership (`paddock-fleet`), the E2B-compatible API
//! (`paddock-e2b`) and the HTTP server, stopped gracefully.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unused_must_use, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub use paddock_core as core;
pub use paddock_engines as engines;
pub use paddock_pool::*;
pub use paddock_telemetry as telemetry;

mod builder;
pub mod config;
/// The configuration's generators and oracles for the fuzz target (and their `cargo
/// test` runs); not part of the public API: built for tests and with the `fuzzing`
/// feature only.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod node;

pub use builder::{BuiltinEngines, PaddockBuilder};
pub use config::PaddockConfig;

/// A builder with the embedded defaults and the built-in engines: the ones the
/// config enables (subprocess and isolate by default, the container engine where
/// the host has an OCI runtime) and its `[engines.NAME]` sections. Leave one out with
/// [`PaddockBuilder::without_subprocess`], [`without_isolate`](PaddockBuilder::without_isolate),
/// [`without_container`](PaddockBuilder::without_container) or
/// [`without`](PaddockBuilder::without); an engine registered with
/// [`PaddockBuilder::engine`] under a built-in's name takes its place.
pub fn builder() -> PaddockBuilder {
    PaddockBuilder::default()
}

#[cfg(test)]
mod tests;

/// The README's Rust examples, compiled as doctests so they stay true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
