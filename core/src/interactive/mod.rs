//! Interactive sandboxes: background processes, terminals and TCP streams to services
//! inside the guest.
//!
//! These are optional capabilities of a [`Sandbox`](crate::Sandbox). An engine that
//! offers one advertises its feature ([`FEATURE_PROCESS`], [`FEATURE_TERMINAL`],
//! [`FEATURE_TCP`]); the others answer `CAPABILITY_NOT_SUPPORTED`.
//!
//! A process or terminal is owned by its sandbox: destroying the sandbox kills it and
//! waits for it, so that when `destroy` returns its exit status is already known.
//!
//! The engine side and the caller side share one [`ProcessShared`]: the engine pushes
//! output into it, reports the exit once, and implements [`ProcessControl`] for
//! input, signals and resizes; callers hold [`ProcessHandle`] or [`TerminalHandle`]
//! (cheap clones of the same process) and read output through an [`OutputReader`].
//!
//! What to start is a [`ProcessSpec`] or [`TerminalSpec`], and a [`TcpTarget`] where
//! to connect; signals are read by [`parse_signal`].

mod process;
mod signal;
mod spec;
mod tcp;

pub use process::{
    OutputReader, ProcessControl, ProcessExit, ProcessHandle, ProcessShared, TerminalHandle,
};
pub use signal::{check_signal, parse_signal, MAX_SIGNAL};
pub use spec::{ProcessSpec, TerminalSize, TerminalSpec};
#[cfg(not(loom))]
pub use tcp::TcpConnection;
pub use tcp::TcpTarget;

/// The feature of engines that run background processes.
pub const FEATURE_PROCESS: &str = "process";
/// The feature of engines that open terminals.
pub const FEATURE_TERMINAL: &str = "terminal";
/// The feature of engines that open TCP streams to the guest's loopback.
pub const FEATURE_TCP: &str = "tcp";

/// Default bytes of unread output kept per process.
pub const DEFAULT_OUTPUT_BUFFER: usize = 1 << 20;
