//! Execution requests, results and output chunks.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Result};
use crate::fleet::OnNodeLoss;
use crate::isolation::{EngineName, IsolationLevel, NetworkPolicy};
use crate::limits::{LimitKind, Limits};
use crate::program::Program;

/// A globally unique execution id: a UUIDv4 for the ids Paddock makes (122 random
/// bits, see [`crate::ids`]), so that one id tells nothing of another. Ids do not
/// sort by creation time: order executions by their timings instead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ExecutionId(String);

impl ExecutionId {
    /// A fresh random (UUIDv4) id.
    pub fn new() -> ExecutionId {
        ExecutionId(crate::ids::random_uuid().to_string())
    }

    /// Parses an id received from a caller; it must be a UUID.
    pub fn parse(s: &str) -> Result<ExecutionId> {
        uuid::Uuid::parse_str(s)
            .map(|u| ExecutionId(u.to_string()))
            .map_err(|e| Error::invalid_options("id", format!("`{s}` is not a UUID: {e}")))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for ExecutionId {
    fn default() -> Self {
        ExecutionId::new()
    }
}

impl fmt::Display for ExecutionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// On the wire an id is a string holding a UUID.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for ExecutionId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ExecutionId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "format": "uuid",
            "description": "An execution id: a UUID (v4, 122 random bits, for the ids Paddock makes; they do not sort by creation time).",
        })
    }
}

/// One execution inside a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The execution's id; a fresh one when absent on the wire.
    #[serde(default)]
    pub id: ExecutionId,
    /// What to run.
    pub program: Program,
    /// Bytes written to the program's stdin, which is then closed. Empty when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Extra environment variables, set after the host environment is sanitized.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory relative to the sandbox workdir; the workdir when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Limits for this execution; unset fields take the sandbox's limits.
    #[serde(default)]
    pub limits: Limits,
    /// The tenant the execution is accounted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl ExecRequest {
    /// A request for `program` with everything else defaulted.
    pub fn new(program: Program) -> ExecRequest {
        ExecRequest {
            id: ExecutionId::new(),
            program,
            stdin: None,
            env: BTreeMap::new(),
            cwd: None,
            limits: Limits::default(),
            tenant: None,
        }
    }

    /// Sets the wall-clock timeout.
    pub fn with_timeout_ms(mut self, ms: u64) -> ExecRequest {
        self.limits.timeout_ms = Some(ms);
        self
    }

    /// Checks the request's own fields. [`crate::ValidRequest::new`] runs it and
    /// keeps the proof, so that the hops after it need not run it again.
    pub fn validate(&self) -> Result<()> {
        crate::valid::note(self);
        self.program.validate()?;
        self.limits.validate("limits", false)?;
        for key in self.env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(Error::invalid_options(
                    "env",
                    format!("`{key}` is not a valid variable name"),
                ));
            }
        }
        if self.env.values().any(|v| v.contains('\0')) {
            return Err(Error::invalid_options(
                "env",
                "values must not contain NUL bytes",
            ));
        }
        if self.stdin.as_deref().is_some_and(|s| s.len() > 64 << 20) {
            return Err(Error::invalid_options("stdin", "is larger than 64 MiB"));
        }
        Ok(())
    }
}

/// An execution as it is ordered: what to run ([`ExecRequest`]) and how (the engine,
/// the isolation level, the network, the caller's trace, what a fleet does if the
/// node running it is lost).
///
/// One type from the surface that reads the caller's body to the engine's pool:
/// the facade's `Execute` carries it, and a fleet's work order embeds it as it is
/// (its fields inline, beside the order's routing), so that the node that runs the
/// work gets it back without copying a field.
///
/// ```
/// use paddock_core::{EngineName, ExecOrder, ExecRequest, IsolationLevel, Program};
///
/// let mut order = ExecOrder::new(ExecRequest::new(Program::command(["true"])));
/// order.engine = Some(EngineName::SUBPROCESS);
/// order.level = IsolationLevel::Strict;
/// assert!(order.on_node_loss.is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecOrder {
    /// The request (its `id` names the execution for cancel and streaming).
    pub request: ExecRequest,
    /// The engine; the configured default when `None`. A fleet's accepting node
    /// names the engine it chose before the order leaves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineName>,
    /// The isolation level required; refused, never downgraded, if the engine
    /// cannot give it.
    pub level: IsolationLevel,
    /// The network policy.
    pub network: NetworkPolicy,
    /// W3C `traceparent` of the caller, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// In a fleet, what to do if the node running it is lost; the fleet's setting
    /// when `None` (a fleet's accepting node names it before the order leaves it).
    /// A single node ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_node_loss: Option<OnNodeLoss>,
}

impl ExecOrder {
    /// An order for `request` on the default engine with default policy.
    pub fn new(request: ExecRequest) -> ExecOrder {
        ExecOrder {
            request,
            engine: None,
            level: IsolationLevel::None,
            network: NetworkPolicy::None,
            traceparent: None,
            on_node_loss: None,
        }
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A piece of output, delivered while the program runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    /// The stream.
    pub stream: StreamKind,
    /// The bytes, as produced (not necessarily valid UTF-8 or whole lines).
    pub data: Vec<u8>,
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// The program ran to its end. `exit_code` is 128+N when it died of signal N.
    Completed {
        /// The exit status.
        exit_code: i32,
        /// The signal that ended it, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// The wall-clock deadline passed and the program was killed.
    TimedOut,
    /// The execution was cancelled and the program was killed.
    Cancelled,
    /// A resource limit ended the program.
    LimitExceeded {
        /// Which limit.
        limit: LimitKind,
    },
    /// The execution could not run or the engine failed.
    Failed {
        /// The cause.
        error: Error,
    },
    /// A json-stdio handler suspended on an external token (for example a human
    /// approval); resuming the token continues it (see `docs/protocol.md`, §7).
    Suspended {
        /// The token the invocation waits for, chosen by the handler.
        token_id: String,
    },
}

impl Outcome {
    /// The wire name of the outcome.
    pub const fn name(&self) -> &'static str {
        match self {
            Outcome::Completed { .. } => "completed",
            Outcome::TimedOut => "timed_out",
            Outcome::Cancelled => "cancelled",
            Outcome::LimitExceeded { .. } => "limit_exceeded",
            Outcome::Failed { .. } => "failed",
            Outcome::Suspended { .. } => "suspended",
        }
    }

    /// The error code a caller would see for this outcome, if it is not a completion
    /// (or a suspension, which is not a failure either).
    pub fn error_code(&self) -> Option<ErrorCode> {
        match self {
            Outcome::Completed { .. } | Outcome::Suspended { .. } => None,
            Outcome::TimedOut => Some(ErrorCode::Timeout),
            Outcome::Cancelled => Some(ErrorCode::Cancelled),
            Outcome::LimitExceeded {
                limit: LimitKind::Memory,
            } => Some(ErrorCode::MemoryExceeded),
            Outcome::LimitExceeded { .. } => Some(ErrorCode::LimitsExceeded),
            Outcome::Failed { error } => Some(error.code),
        }
    }
}

/// Resources an execution used. `0` means "not measured".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Usage {
    /// CPU time (user + system) of the program and its waited-for children.
    pub cpu_ms: u64,
    /// Wall-clock time from start to exit.
    pub wall_ms: u64,
    /// Peak resident memory.
    pub peak_memory_bytes: u64,
}

/// When an execution was queued, started and finished, in Unix milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Timings {
    /// Accepted by Paddock.
    pub queued_at_ms: u64,
    /// The program started.
    pub started_at_ms: u64,
    /// The result was ready.
    pub finished_at_ms: u64,
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The result of one execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecResult {
    /// The execution id.
    pub id: ExecutionId,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Captured stdout (lossy UTF-8), capped.
    pub stdout: String,
    /// Captured stderr (lossy UTF-8), capped.
    pub stderr: String,
    /// Whether stdout went past the cap and was cut.
    pub stdout_truncated: bool,
    /// Whether stderr went past the cap and was cut.
    pub stderr_truncated: bool,
    /// A JSON value returned by a handler or isolate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// Resources used.
    pub usage: Usage,
    /// The engine that ran it.
    pub engine: EngineName,
    /// The engine instance that ran it: a pooled instance, which serves one
    /// execution or sandbox after another (a sandbox opened through the scheduler
    /// has an id of its own, different from its instance's).
    pub instance_id: String,
    /// Timestamps.
    pub timings: Timings,
    /// Non-fatal notes, such as policy warnings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The egress decisions made while it ran, when its sandbox's network is an
    /// allowlist (see [`crate::egress`]): each connection and name lookup, allowed
    /// or denied, with its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::EgressReport>,
}

impl ExecResult {
    /// A result without output, all timestamps now: what an engine that ran nothing
    /// (or a scheduler that stopped an execution itself) reports.
    pub fn empty(
        id: ExecutionId,
        outcome: Outcome,
        engine: EngineName,
        instance_id: impl Into<String>,
    ) -> ExecResult {
        let now = unix_ms();
        ExecResult {
            id,
            outcome,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            value: None,
            usage: Usage::default(),
            engine,
            instance_id: instance_id.into(),
            timings: Timings {
                queued_at_ms: now,
                started_at_ms: now,
                finished_at_ms: now,
            },
            warnings: Vec::new(),
            egress: None,
        }
    }

    /// A result for an execution that failed before or instead of running.
    pub fn failed(id: ExecutionId, engine: EngineName, error: Error) -> ExecResult {
        ExecResult::empty(id, Outcome::Failed { error }, engine, "")
    }

    /// Completed with exit code 0 if `cancel` can still finish, else cancelled: the
    /// outcome of a no-op run under the exactly-one-terminal-state rule.
    pub fn noop_outcome(cancel: &crate::CancelToken) -> Outcome {
        if cancel.finish() {
            Outcome::Completed {
                exit_code: 0,
                signal: None,
            }
        } else {
            Outcome::Cancelled
        }
    }

    /// Completed with exit code 0.
    pub fn is_success(&self) -> bool {
        matches!(self.outcome, Outcome::Completed { exit_code: 0, .. })
    }

    /// The wire form with `exit_code` and `signal` always present (`null` when the
    /// program did not complete) and `timed_out`, as the CLI and the HTTP API print it
    /// (see [`WireResult`]).
    pub fn to_wire_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        let signal = match self.outcome {
            Outcome::Completed { signal, .. } => signal,
            _ => None,
        };
        let fields = WireFields {
            exit_code: self.exit_code(),
            signal,
            timed_out: self.outcome == Outcome::TimedOut,
        };
        if let (Some(obj), Ok(serde_json::Value::Object(fields))) =
            (v.as_object_mut(), serde_json::to_value(fields))
        {
            obj.extend(fields);
        }
        v
    }

    /// A copy without its stdout and stderr (both empty), made without copying them.
    pub fn without_output(&self) -> ExecResult {
        ExecResult {
            id: self.id.clone(),
            outcome: self.outcome.clone(),
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
            value: self.value.clone(),
            usage: self.usage,
            engine: self.engine.clone(),
            instance_id: self.instance_id.clone(),
            timings: self.timings,
            warnings: self.warnings.clone(),
            egress: self.egress.clone(),
        }
    }

    /// The exit code, when the program completed.
    pub fn exit_code(&self) -> Option<i32> {
        match self.outcome {
            Outcome::Completed { exit_code, .. } => Some(exit_code),
            _ => None,
        }
    }
}

/// An [`ExecResult`] in its wire form, [`ExecResult::to_wire_json`]: the result with
/// `exit_code` and `signal` always present and `timed_out` added. What the HTTP API
/// answers for an execution (its schema is `ExecutionResult`).
#[derive(Debug, Clone, Copy)]
pub struct WireResult<'a>(pub &'a ExecResult);

impl Serialize for WireResult<'_> {
    /// The wire form of everything but the output, with stdout and stderr written
    /// from the result itself: a large output is not copied on its way out.
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let shell = self.0.without_output().to_wire_json();
        let serde_json::Value::Object(fields) = shell else {
            return shell.serialize(serializer);
        };
        let mut map = serializer.serialize_map(Some(fields.len()))?;
        for (key, value) in &fields {
            match key.as_str() {
                "stdout" => map.serialize_entry(key, &self.0.stdout)?,
                "stderr" => map.serialize_entry(key, &self.0.stderr)?,
                _ => map.serialize_entry(key, value)?,
            }
        }
        map.end()
    }
}

/// The fields the wire form writes beside (or over) the serialized result.
#[derive(Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
struct WireFields {
    /// The exit status; `null` unless the program completed.
    exit_code: Option<i32>,
    /// The signal that ended the program; `null` if none did.
    signal: Option<i32>,
    /// Whether the wall-clock deadline ended it (`outcome` is `timed_out`).
    timed_out: bool,
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for WireResult<'_> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ExecutionResult".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let result = generator.subschema_for::<ExecResult>();
        let fields = generator.subschema_for::<WireFields>();
        schemars::json_schema!({
            "description": "An execution's result as the HTTP API and the CLI print it: an ExecResult with `exit_code` and `signal` always present and `timed_out`.",
            "allOf": [result, fields],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_wire_form_flattens_the_outcome() {
        let mut r = ExecResult::failed(
            ExecutionId::new(),
            EngineName::SUBPROCESS,
            Error::new(ErrorCode::SpawnFailed, "x"),
        );
        r.outcome = Outcome::Completed {
            exit_code: 3,
            signal: None,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["outcome"], "completed");
        assert_eq!(v["exit_code"], 3);
        let back: ExecResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        r.outcome = Outcome::LimitExceeded {
            limit: LimitKind::Memory,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["outcome"], "limit_exceeded");
        assert_eq!(v["limit"], "memory");
        assert_eq!(r.outcome.error_code(), Some(ErrorCode::MemoryExceeded));
    }

    #[test]
    fn request_defaults_and_validation() {
        let r: ExecRequest = serde_json::from_str(r#"{"program":{"command":["true"]}}"#).unwrap();
        assert!(r.validate().is_ok());
        assert!(ExecutionId::parse(r.id.as_str()).is_ok());
        let mut bad = r.clone();
        bad.env.insert("A=B".into(), "x".into());
        assert_eq!(bad.validate().unwrap_err().code, ErrorCode::InvalidOptions);
        assert!(serde_json::from_str::<ExecRequest>(
            r#"{"program":{"command":["true"]},"bogus":1}"#
        )
        .is_err());
        assert!(ExecutionId::parse("nope").is_err());
    }
}
