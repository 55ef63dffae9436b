//! # paddock-pool
//!
//! Paddock's scheduler: the actors between a caller and the engines that run its
//! code. The supervisor validates a request, puts it through the [`policy`] stage and
//! the [`limiter`], takes a warm engine from a pool, streams the output and records
//! the result in the [`audit`] log; the `Paddock` handle is how an embedder drives
//! all of it. The supervisor, pools, streamer and handle are still to come; this
//! crate holds the stages they are built from, each a pure core with an actor around
//! it, all reading time from an injectable [`clock`].
//!
//! ```
//! use paddock_core::{ErrorCode, Language, Program};
//! use paddock_pool::policy::{Policy, PolicyConfig};
//!
//! let policy = Policy::new(PolicyConfig::default()).unwrap();
//! let refusal = policy
//!     .check(&Program::code(Language::Javascript, "require('fs')"))
//!     .unwrap_err();
//! assert_eq!(refusal.error.code, ErrorCode::CodeBlocked);
//! assert!(refusal.error.message.starts_with("blocked by rule block-require:"));
//! assert!(policy.check(&Program::code(Language::Javascript, "const processed = 1")).is_ok());
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod audit;
pub mod clock;
pub mod limiter;
pub mod policy;

pub mod engine_actor;
mod engine_pool;
pub mod messages;
mod paddock;
pub use paddock_core::{slots, stream_buffer};
pub mod streamer;
mod supervisor;

pub use engine_pool::PoolStats;
pub use messages::*;
pub use paddock::{ExecutionStream, Paddock, PaddockBuilder, SandboxHandle, StreamEvent};
pub use supervisor::Supervisor;
