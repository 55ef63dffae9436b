//! Error codes and the error type every Paddock API returns.
//!
//! The wire sees only [`ErrorCode`]: a closed set of stable `SCREAMING_SNAKE` strings,
//! kept in one table together with the advice each code gives its caller.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $variant:ident => $wire:literal, $hint:literal; )*) => {
        /// A stable, machine-readable error code.
        ///
        /// The wire form (`as_str`, serde) never changes once released.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        pub enum ErrorCode {
            $( $(#[$doc])* #[serde(rename = $wire)] $variant, )*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[ $( ErrorCode::$variant, )* ];

            /// The stable wire string, for example `"POOL_EXHAUSTED"`.
            pub const fn as_str(self) -> &'static str {
                match self { $( ErrorCode::$variant => $wire, )* }
            }

            /// What a caller should do about this error, in one sentence.
            pub const fn hint(self) -> &'static str {
                match self { $( ErrorCode::$variant => $hint, )* }
            }

            /// Looks a code up by its wire string.
            pub fn from_wire(s: &str) -> Option<ErrorCode> {
                match s { $( $wire => Some(ErrorCode::$variant), )* _ => None }
            }
        }
    };
}

error_codes! {
    /// A configuration value is missing, malformed or out of range.
    InvalidConfig => "INVALID_CONFIG", "fix the named configuration field and reload";
    /// A request field is malformed or out of range.
    InvalidOptions => "INVALID_OPTIONS", "fix the named request field and retry";
    /// A module definition is malformed.
    InvalidModule => "INVALID_MODULE", "check the module's name and exports";
    /// A module is on the denylist.
    BlockedModule => "BLOCKED_MODULE", "remove the import; this module is never available in a sandbox";
    /// A tenant exceeded its rate or concurrency quota.
    RateLimited => "RATE_LIMITED", "retry after the indicated delay or lower the request rate";
    /// An operation ran past its deadline.
    Timeout => "TIMEOUT", "raise the timeout or make the program faster";
    /// The program used more memory than its limit.
    MemoryExceeded => "MEMORY_EXCEEDED", "raise the memory limit or use less memory";
    /// The program hit a resource limit other than memory or time.
    LimitsExceeded => "LIMITS_EXCEEDED", "raise the named limit or use less of the resource";
    /// A policy rule refused the code before it ran.
    CodeBlocked => "CODE_BLOCKED", "remove the construct the named rule refuses";
    /// The code is longer than the policy allows.
    CodeTooLong => "CODE_TOO_LONG", "shorten the code or raise the policy's length cap";
    /// The engine or sandbox was already destroyed.
    EngineDisposed => "ENGINE_DISPOSED", "open a new sandbox; this one has been destroyed";
    /// The engine failed in a way that is not the program's fault.
    EngineFailed => "ENGINE_FAILED", "retry; if it persists, run `paddock doctor`";
    /// A warm worker process died or misbehaved.
    WorkerFailed => "WORKER_FAILED", "retry; the worker has been replaced";
    /// The program's process could not be started.
    SpawnFailed => "SPAWN_FAILED", "check that the program exists and is executable inside the sandbox";
    /// No engine instance became free in time and the wait queue is full or timed out.
    PoolExhausted => "POOL_EXHAUSTED", "retry later, or raise the pool's max_size or acquire_timeout";
    /// A stream was used after it was closed.
    StreamClosed => "STREAM_CLOSED", "subscribe before the execution completes";
    /// The execution was cancelled.
    Cancelled => "CANCELLED", "nothing to fix: the execution was cancelled on request";
    /// The engine cannot provide the requested isolation level.
    LevelNotSupported => "LEVEL_NOT_SUPPORTED", "choose an engine that provides this isolation level";
    /// The engine does not support the requested program kind or feature.
    CapabilityNotSupported => "CAPABILITY_NOT_SUPPORTED", "choose an engine that advertises this capability";
    /// A path points outside the sandbox's workdir.
    PathEscape => "PATH_ESCAPE", "use a path inside the sandbox workdir without `..` or escaping symlinks";
    /// The named sandbox, execution or file does not exist.
    NotFound => "NOT_FOUND", "check the id or path";
    /// A json-stdio frame was malformed.
    ProtocolError => "PROTOCOL_ERROR", "send newline-delimited JSON frames as docs/protocol.md specifies";
    /// The sandbox is paused: it runs nothing until it is unpaused.
    SandboxPaused => "SANDBOX_PAUSED", "unpause the sandbox, then retry";
    /// The fleet node that ran the execution or holds the sandbox was lost; what the
    /// program did there is unknown.
    NodeLost => "NODE_LOST", "check whether the program's effects happened, then run it again (or ask for on_node_loss = \"retry\")";
    /// The fleet's NATS cluster did not answer in time (a leader election, or this
    /// node is cut off from it).
    FleetUnavailable => "FLEET_UNAVAILABLE", "retry after the indicated delay; the fleet's NATS cluster is electing a leader or out of reach";
    /// The request carries no API key, or one the server does not know (HTTP 401).
    Unauthorized => "UNAUTHORIZED", "send one of the server's API keys (`Authorization: Bearer <key>`, or `X-API-Key` on the E2B API)";
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error every fallible Paddock call returns: a stable code and a message that says
/// what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
// `Error` on the wire is the envelope `{"error": …}`; this is what it holds.
#[cfg_attr(feature = "schema", schemars(rename = "ErrorDetail"))]
pub struct Error {
    /// The stable code.
    pub code: ErrorCode,
    /// Human-readable detail: what was wrong and what to do.
    pub message: String,
    /// For `RATE_LIMITED` and `POOL_EXHAUSTED`: how long to wait before retrying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl Error {
    /// Creates an error with the given code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// Adds a retry hint (for `RATE_LIMITED` and `POOL_EXHAUSTED`).
    pub fn with_retry_after_ms(mut self, ms: u64) -> Self {
        self.retry_after_ms = Some(ms);
        self
    }

    /// `INVALID_CONFIG` for a named field.
    pub fn invalid_config(field: &str, problem: impl fmt::Display) -> Self {
        Error::new(
            ErrorCode::InvalidConfig,
            format!("config field `{field}`: {problem}"),
        )
    }

    /// `INVALID_OPTIONS` for a named request field.
    pub fn invalid_options(field: &str, problem: impl fmt::Display) -> Self {
        Error::new(
            ErrorCode::InvalidOptions,
            format!("request field `{field}`: {problem}"),
        )
    }

    /// `ENGINE_DISPOSED` for a sandbox that was destroyed.
    pub fn disposed(what: &str) -> Self {
        Error::new(
            ErrorCode::EngineDisposed,
            format!("{what} has been destroyed; open a new sandbox"),
        )
    }

    /// `ENGINE_FAILED` wrapping an I/O error with context.
    pub fn engine_io(context: &str, err: std::io::Error) -> Self {
        Error::new(ErrorCode::EngineFailed, format!("{context}: {err}"))
    }
}

/// Result alias using [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_strings_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "duplicate {code}");
            assert_eq!(ErrorCode::from_wire(code.as_str()), Some(code));
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
            assert!(!code.hint().is_empty());
            assert!(code
                .as_str()
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_'));
        }
        assert_eq!(ErrorCode::ALL.len(), 26);
        assert_eq!(ErrorCode::from_wire("pool_exhausted"), None);
    }

    #[test]
    fn error_serializes_with_code_and_message() {
        let e = Error::invalid_config("pool.max_size", "must be at least 1");
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["code"], "INVALID_CONFIG");
        assert_eq!(
            v["message"],
            "config field `pool.max_size`: must be at least 1"
        );
        assert_eq!(
            e.to_string(),
            "INVALID_CONFIG: config field `pool.max_size`: must be at least 1"
        );
        assert!(v.get("retry_after_ms").is_none());
        let r = Error::new(ErrorCode::RateLimited, "slow down").with_retry_after_ms(250);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["retry_after_ms"], 250);
        assert_eq!(serde_json::from_value::<Error>(v).unwrap(), r);
    }
}
