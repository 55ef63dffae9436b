//! # paddock-core
//!
//! The vocabulary of Paddock, the embeddable scheduler for running untrusted code:
//! request and result types, the [`Engine`] / [`Sandbox`] contract every backend
//! implements, the stable [`ErrorCode`]s, the configuration's shared types and
//! loading ([`config`]), the json-stdio [`protocol`], and the [`CancelToken`] with
//! exactly one terminal state.
//!
//! This crate has no actors and no engines; it is what every other Paddock crate and
//! every embedder shares. The sections of the configuration live with the crates they
//! configure, and the whole document in the `paddock` crate.
//!
//! ```
//! use paddock_core::{ExecRequest, Program, Language, ErrorCode};
//!
//! let req = ExecRequest::new(Program::code(Language::Python, "print(6 * 7)"))
//!     .with_timeout_ms(5_000);
//! assert!(req.validate().is_ok());
//!
//! let bad = ExecRequest::new(Program::command(Vec::<String>::new()));
//! assert_eq!(bad.validate().unwrap_err().code, ErrorCode::InvalidOptions);
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod api;
pub mod budget;
pub mod cancel;
pub mod config;
pub mod egress;
pub mod engine;
pub mod error;
pub mod exec;
pub mod files;
pub mod fleet;
/// Generators and oracles for the fuzz targets (and their `cargo test` runs); not
/// part of the public API: built for tests and with the `fuzzing` feature only.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod hash;
pub mod host;
pub mod ids;
pub mod input;
pub mod interactive;
pub mod isolation;
pub mod lifecycle;
pub mod limits;
pub(crate) mod loom;
pub mod metadata;
pub mod output;
pub mod program;
pub mod protocol;
pub mod spin;
pub mod stream_buffer;
mod strict;
pub mod tenancy;
pub mod usage;
pub mod valid;

pub use cancel::{CancelToken, TokenState};
pub use config::LimitsConfig;
pub use engine::{DiscardSink, Engine, FileEntry, OutputSink, Sandbox, SandboxSpec, SandboxStatus};
pub use error::{Error, ErrorCode, Result};
pub use exec::{
    unix_ms, ExecOrder, ExecRequest, ExecResult, ExecutionId, Outcome, OutputChunk, StreamKind,
    Timings, Usage, WireResult,
};
pub use files::{
    check_metadata, ByteSource, FileEvent, FileEventKind, FileInfo, FileKind, FileMetadata,
    FileReader, FileWatch, MAX_METADATA_BYTES, MAX_METADATA_KEY, METADATA_XATTR_PREFIX,
};
pub use fleet::OnNodeLoss;
pub use hash::code_hash;
#[cfg(not(loom))]
pub use interactive::TcpConnection;
pub use interactive::{
    OutputReader, ProcessExit, ProcessHandle, ProcessSpec, TcpTarget, TerminalHandle, TerminalSize,
    TerminalSpec,
};
pub use isolation::{Capabilities, EngineName, IsolationLevel, NetworkPolicy};
pub use limits::{LimitKind, LimitSpec, Limits, LIMIT_TABLE};
pub use program::{Language, Program, ProgramKind};
pub use tenancy::{AccessRules, Allowed, NetworkKind};
pub use usage::SandboxUsage;
pub use valid::ValidRequest;
#[cfg(any(test, feature = "probes"))]
pub use valid::ValidationProbe;
