//! # paddock-engines
//!
//! The engines that run Paddock executions: the [`subprocess`] engine (host
//! processes with a cgroup, rlimits, an empty network namespace and a kill that
//! catches the whole tree, and warm json-stdio workers), the [`isolate`] engine
//! (JavaScript in QuickJS), and the [`container`] engine (an OCI runtime). Every
//! engine implements [`paddock_core::Engine`]. Each engine's section of the
//! configuration is its own ([`SubprocessConfig`], [`IsolateConfig`],
//! [`ContainerConfig`], with [`EgressConfig`] and the `[engines.NAME]` sections'
//! [`EngineDef`]); [`builtin`] makes the engines a [`BuiltinConfig`] enables.
//!
//! ```no_run
//! # async fn demo() -> paddock_core::Result<()> {
//! use paddock_core::{CancelToken, DiscardSink, Engine, ExecRequest, Program, SandboxSpec};
//! use paddock_engines::subprocess::{SubprocessConfig, SubprocessEngine};
//!
//! let engine = SubprocessEngine::new(&SubprocessConfig::default())?;
//! let sandbox = engine.create(&SandboxSpec::default()).await?;
//! let result = sandbox
//!     .exec(ExecRequest::new(Program::command(["echo", "hi"])), &DiscardSink, CancelToken::new())
//!     .await?;
//! assert_eq!(result.stdout, "hi\n");
//! sandbox.destroy().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]
// System calls are made in the host layer (`host/`), each behind a safe function;
// the only other `unsafe` is the isolate's allocator. Everything else is safe code.
#![deny(unsafe_code)]

mod builtin;
pub mod capture;
mod child;
pub mod container;
mod egress;
pub mod env;
mod host;
mod interactive;
pub mod isolate;
mod lease;
mod named;
mod sandbox;
pub mod subprocess;
mod task;
mod warm;

pub use builtin::{builtin, Builtin, BuiltinConfig, BUILTIN_NAMES};
pub use container::{
    ContainerConfig, OciRuntime, RunscPlatform, CONTAINER_OWN_ENV, USERNS_IDS_PER_SANDBOX,
};
pub use egress::EgressConfig;
pub use host::{cgroup, netns, stats, volume, workdir};
pub use isolate::IsolateConfig;
pub use named::{EngineDef, EngineKind, MAX_ENGINE_DEFS};
pub use subprocess::{CgroupMode, HandlerConfig, Startup, SubprocessConfig, WarmConfig};
