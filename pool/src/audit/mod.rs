//! The audit log: exactly one [`AuditEntry`] per accepted execution, kept in a
//! bounded in-memory ring and appended to an NDJSON file.
//!
//! [`AuditLog`] is the logic; the [`Audit`] actor owns one and answers [`Record`],
//! [`Search`], [`Statistics`], [`Health`] and [`Flush`].
//!
//! - **Entries** hold the execution's id, an RFC 3339 timestamp, tenant, engine,
//!   `code_hash`, duration, outcome, exit code, peak memory, kill reason and error
//!   code. Never the code, stdin, output or environment.
//! - **Ring**: the newest `ring_capacity` entries, for [`AuditLog::search`] (newest
//!   first) and the percentiles of [`AuditLog::statistics`]. An entry whose id is
//!   still in the ring is refused, so recording twice cannot count twice.
//! - **File**: one JSON object per line, appended, buffered and flushed on an
//!   interval, on [`Flush`], when the actor stops and when the log is dropped.
//!   Before a line would take the file past `max_file_bytes` the file becomes
//!   `<file>.1` (`.1` → `.2`, …; the file past `max_files` is deleted) and a new one
//!   is started; the buffer is written before the rename, so no entry is lost across
//!   a rotation. A write error never fails a record: the entry stays in the ring, the
//!   error shows in [`AuditHealth`], and the next write reopens the file.
//! - **`on_log`**: a callback called once per recorded entry.
//!
//! The caller (the supervisor) owns the "exactly one entry per accepted execution"
//! rule: it records the entry when the execution's result is final, whatever the
//! outcome; requests refused before they were accepted get no entry.

mod access;
mod actor;
mod config;
mod entry;
mod log;
mod sink;

pub use access::{OperatorAccess, MAX_ACCESS_RECORDS};
pub use actor::{
    Accesses, Audit, Flush, Health, Record, RecordAccess, Search, SearchFor, Statistics,
    StatisticsFor,
};
pub use entry::{AuditEntry, AuditOutcome, KillReason, Timestamp};
pub use log::{
    AuditConfig, AuditHealth, AuditLog, AuditQuery, AuditStats, OnLog, DEFAULT_SEARCH_LIMIT,
};
