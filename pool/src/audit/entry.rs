//! One audit record, and the RFC 3339 [`Timestamp`] it carries.

use std::fmt;

use paddock_core::{EngineName, Error, ErrorCode, ExecResult, ExecutionId, LimitKind, Outcome};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in time, in Unix milliseconds, written as RFC 3339 UTC with milliseconds
/// (`2026-11-29T22:19:56.123Z`).
///
/// It deserializes from an RFC 3339 string with any offset and any number of
/// fraction digits (truncated to milliseconds), or from an integer of Unix
/// milliseconds.
///
/// ```
/// use paddock_pool::audit::Timestamp;
///
/// let t = Timestamp::from_unix_ms(1_700_000_000_123);
/// assert_eq!(t.to_string(), "2023-11-14T22:13:20.123Z");
/// assert_eq!(Timestamp::parse_rfc3339("2023-11-14T23:13:20.123+01:00").unwrap(), t);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

/// 9999-12-31T23:59:59.999Z, the last instant RFC 3339 can write.
const MAX_UNIX_MS: u64 = 253_402_300_799_999;

impl Timestamp {
    /// The timestamp `ms` milliseconds after the Unix epoch (clamped to the year 9999).
    pub fn from_unix_ms(ms: u64) -> Timestamp {
        Timestamp(ms.min(MAX_UNIX_MS))
    }

    /// Milliseconds since the Unix epoch.
    pub fn unix_ms(self) -> u64 {
        self.0
    }

    /// Parses an RFC 3339 date-time; `INVALID_OPTIONS` when it is not one or lies
    /// before 1970.
    pub fn parse_rfc3339(text: &str) -> Result<Timestamp, Error> {
        let parsed =
            time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
                .map_err(|e| {
                    Error::invalid_options(
                        "timestamp",
                        format!("`{text}` is not an RFC 3339 date-time: {e}"),
                    )
                })?;
        let ms = parsed.unix_timestamp_nanos().div_euclid(1_000_000);
        u64::try_from(ms)
            .map(Timestamp::from_unix_ms)
            .map_err(|_| Error::invalid_options("timestamp", format!("`{text}` is before 1970")))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0) * 1_000_000)
            .expect("clamped to the year 9999");
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Timestamp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RFC 3339 date-time or Unix milliseconds")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Timestamp, E> {
                Timestamp::parse_rfc3339(v).map_err(|e| E::custom(e.message))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Timestamp, E> {
                Ok(Timestamp::from_unix_ms(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Timestamp, E> {
                u64::try_from(v)
                    .map(Timestamp::from_unix_ms)
                    .map_err(|_| E::custom("a timestamp before 1970"))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Written as an RFC 3339 string; read from one or from Unix milliseconds.
impl schemars::JsonSchema for Timestamp {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let text = schemars::json_schema!({
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339 UTC with milliseconds (`2026-11-29T22:19:56.123Z`).",
        });
        if generator.contract().is_serialize() {
            return text;
        }
        schemars::json_schema!({
            "oneOf": [
                text,
                {"type": "integer", "minimum": 0, "description": "Unix milliseconds."},
            ],
        })
    }
}

/// How an execution ended, as the audit log names it (the wire names of
/// [`Outcome`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditOutcome {
    /// The program ran to its end (any exit code).
    Completed,
    /// The deadline passed.
    TimedOut,
    /// The execution was cancelled.
    Cancelled,
    /// A resource limit ended it.
    LimitExceeded,
    /// It could not run, or the engine failed.
    Failed,
    /// A handler suspended on an external token.
    Suspended,
}

impl From<&Outcome> for AuditOutcome {
    fn from(outcome: &Outcome) -> AuditOutcome {
        match outcome {
            Outcome::Completed { .. } => AuditOutcome::Completed,
            Outcome::TimedOut => AuditOutcome::TimedOut,
            Outcome::Cancelled => AuditOutcome::Cancelled,
            Outcome::LimitExceeded { .. } => AuditOutcome::LimitExceeded,
            Outcome::Failed { .. } => AuditOutcome::Failed,
            Outcome::Suspended { .. } => AuditOutcome::Suspended,
        }
    }
}

/// Why Paddock killed a program, when it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KillReason {
    /// The wall-clock deadline.
    Timeout,
    /// A cancel request.
    Cancel,
    /// The memory limit.
    Memory,
    /// The process count limit.
    Pids,
    /// The output cap.
    Output,
    /// The CPU-time limit.
    Cpu,
    /// The file size limit.
    FileSize,
    /// The disk quota (the program's writes failed with `ENOSPC`).
    Disk,
    /// The workdir's file-count cap.
    DiskFiles,
}

impl KillReason {
    /// The kill reason an outcome implies; `None` for completions and failures.
    pub fn of(outcome: &Outcome) -> Option<KillReason> {
        Some(match outcome {
            Outcome::TimedOut => KillReason::Timeout,
            Outcome::Cancelled => KillReason::Cancel,
            Outcome::LimitExceeded { limit } => match limit {
                LimitKind::Memory => KillReason::Memory,
                LimitKind::Pids => KillReason::Pids,
                LimitKind::Output => KillReason::Output,
                LimitKind::Cpu => KillReason::Cpu,
                LimitKind::FileSize => KillReason::FileSize,
                LimitKind::Disk => KillReason::Disk,
                LimitKind::DiskFiles => KillReason::DiskFiles,
            },
            Outcome::Completed { .. } | Outcome::Failed { .. } | Outcome::Suspended { .. } => {
                return None
            }
        })
    }
}

/// One execution, as the audit log keeps it.
///
/// By construction it holds neither the code (only its [`code_hash`]) nor the
/// environment, stdin or output of the execution.
///
/// [`code_hash`]: paddock_core::code_hash
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditEntry {
    /// The execution id.
    pub id: ExecutionId,
    /// When the execution finished.
    pub timestamp: Timestamp,
    /// The tenant it was accounted to.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The engine that ran (or refused) it.
    pub engine: EngineName,
    /// [`paddock_core::code_hash`] of the program's audit text.
    pub code_hash: String,
    /// Wall-clock duration of the run in milliseconds.
    pub duration_ms: u64,
    /// How it ended.
    pub outcome: AuditOutcome,
    /// The exit code, when it completed.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Peak memory in bytes; 0 when not measured.
    pub memory_bytes: u64,
    /// Why it was killed, if it was.
    #[serde(default)]
    pub kill_reason: Option<KillReason>,
    /// The error code a caller saw, unless it completed.
    #[serde(default)]
    pub error_code: Option<ErrorCode>,
    /// Its egress decisions, when its sandbox's network is an allowlist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<paddock_core::egress::EgressReport>,
}

impl AuditEntry {
    /// The entry for `result`. `code_hash` is normally
    /// `paddock_core::code_hash(&program.audit_text())`.
    ///
    /// The timestamp is the result's `finished_at_ms` (now, if unset); the duration is
    /// the measured wall time, or `finished - started` when the engine did not measure
    /// it.
    pub fn from_result(result: &ExecResult, tenant: Option<&str>, code_hash: String) -> AuditEntry {
        let t = &result.timings;
        let finished = if t.finished_at_ms == 0 {
            paddock_core::unix_ms()
        } else {
            t.finished_at_ms
        };
        let duration_ms = if result.usage.wall_ms > 0 {
            result.usage.wall_ms
        } else {
            t.finished_at_ms.saturating_sub(t.started_at_ms)
        };
        AuditEntry {
            id: result.id.clone(),
            timestamp: Timestamp::from_unix_ms(finished),
            tenant: tenant.map(str::to_owned),
            engine: result.engine.clone(),
            code_hash,
            duration_ms,
            outcome: AuditOutcome::from(&result.outcome),
            exit_code: result.exit_code(),
            memory_bytes: result.usage.peak_memory_bytes,
            kill_reason: KillReason::of(&result.outcome),
            error_code: result.outcome.error_code(),
            egress: result.egress.clone(),
        }
    }

    /// Completed with exit code 0.
    pub fn is_success(&self) -> bool {
        self.outcome == AuditOutcome::Completed && self.exit_code == Some(0)
    }
}
