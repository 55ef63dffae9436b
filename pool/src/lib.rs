//! # paddock-pool
//!
//! Paddock's scheduler: the actors between a caller and the engines that run its
//! code. Every execution goes through
//! **policy → limiter → pool → engine → streamer → audit**:
//!
//! - the [`Supervisor`] actor validates a request, puts it through the [`policy`]
//!   stage and the [`limiter`], leases a warm instance from the engine's pool (bounded
//!   wait queue, `POOL_EXHAUSTED` when full), runs it on the instance's
//!   [`engine_actor`] with a watchdog, and recycles or retires the instance;
//! - the [`streamer`] keeps each execution's output in a bounded buffer whose slowest
//!   subscriber slows the engine down (backpressure to the child's pipe);
//! - the [`audit`] actor records exactly one entry per accepted execution;
//! - [`Paddock`] is the handle for plain async Rust, and the [`messages`] are the API
//!   other actors use on `Addr<Supervisor>`.
//!
//! The scheduler knows no engine type: it runs the engines registered with
//! [`PaddockBuilder::engine`] and those its [`EngineRegistry`] makes from the
//! configuration. This crate has none of the real engines; the `paddock` crate puts
//! the two together (`paddock::builder()` knows the built-in subprocess, isolate and
//! container engines). Alone, it runs the engines you give it, such as the
//! [`noop`] engine:
//!
//! ```
//! # #[tokio::main] async fn main() -> Result<(), paddock_core::Error> {
//! use std::sync::Arc;
//! use paddock_core::{ExecRequest, Program};
//! use paddock_pool::{noop::NoopEngine, Paddock};
//!
//! let paddock = Paddock::builder().engine(Arc::new(NoopEngine::new())).start()?;
//! let result = paddock.execute(ExecRequest::new(Program::command(["true"]))).await?;
//! assert_eq!(result.exit_code(), Some(0));
//! paddock.shutdown(std::time::Duration::from_secs(5)).await?;
//! # Ok(()) }
//! ```
//!
//! The stages are pure cores with an actor around each, reading time from an
//! injectable [`clock`]:
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

pub(crate) mod loom;
pub mod slots;

/// Items left out of the loom models' build (see `Cargo.toml`): everything but the
/// slot accounting.
macro_rules! not_under_loom {
    ($($item:item)*) => { $( #[cfg(not(loom))] $item )* };
}

not_under_loom! {
    pub mod audit;
    mod caller;
    pub mod clock;
    pub mod config;
    pub mod limiter;
    pub mod policy;

    mod creation;
    pub mod engine_actor;
    mod engine_pool;
    pub mod federation;
    pub mod http;
    mod memory;
    pub mod messages;
    pub mod noop;
    mod paddock;
    mod parking;
    mod pipeline;
    pub use paddock_core::stream_buffer;
    mod shares;
    pub mod streamer;
    mod supervisor;

    pub use caller::Caller;
    pub use config::{PoolConfig, SchedulerConfig};
    pub use engine_pool::PoolStats;
    pub use messages::*;
    pub use paddock::{
        EngineRegistry, ExecutionStream, MadeEngines, OutputRelay, Paddock, PaddockBuilder,
        SandboxHandle, StreamEvent,
    };
    pub use supervisor::Supervisor;
}
