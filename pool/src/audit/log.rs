//! [`AuditLog`]: the ring, the file sink, queries and statistics, without an actor.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

use paddock_core::{EngineName, Error, ExecutionId};
use serde::{Deserialize, Serialize};

use super::access::{OperatorAccess, MAX_ACCESS_RECORDS};
use super::entry::{AuditEntry, Timestamp};
use super::sink::FileSink;

/// The callback [`AuditLog`] calls once for every entry it records.
pub type OnLog = Arc<dyn Fn(&AuditEntry) + Send + Sync>;

/// The number of entries [`AuditLog::search`] returns when the query sets no limit.
pub const DEFAULT_SEARCH_LIMIT: usize = 100;

pub use super::config::AuditConfig;

/// Which entries [`AuditLog::search`] returns. Every filter is optional.
///
/// ```
/// use paddock_pool::audit::AuditQuery;
///
/// let q: AuditQuery = serde_json::from_str(
///     r#"{"success": false, "tenant": "acme", "after": "2026-01-01T00:00:00Z", "limit": 10}"#,
/// ).unwrap();
/// assert_eq!(q.limit, Some(10));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditQuery {
    /// Only successes (`true`: completed with exit code 0) or only the rest (`false`).
    pub success: Option<bool>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this engine.
    pub engine: Option<EngineName>,
    /// Only entries at or after this time (inclusive).
    pub after: Option<Timestamp>,
    /// Only entries before this time (exclusive).
    pub before: Option<Timestamp>,
    /// At most this many entries; default [`DEFAULT_SEARCH_LIMIT`].
    pub limit: Option<usize>,
}

impl AuditQuery {
    /// Whether `entry` passes every filter.
    pub fn matches(&self, entry: &AuditEntry) -> bool {
        self.success.is_none_or(|s| entry.is_success() == s)
            && self
                .tenant
                .as_deref()
                .is_none_or(|t| entry.tenant.as_deref() == Some(t))
            && self.engine.as_ref().is_none_or(|e| entry.engine == *e)
            && self.after.is_none_or(|a| entry.timestamp >= a)
            && self.before.is_none_or(|b| entry.timestamp < b)
    }
}

/// Execution statistics.
///
/// `total`, `success`, `failure`, `avg_duration_ms` and `total_memory_bytes` count
/// every entry recorded since start. `p50_ms` and `p99_ms` are nearest-rank
/// percentiles of the durations of the `sample` entries still in the ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditStats {
    /// Entries recorded.
    pub total: u64,
    /// Of which completed with exit code 0.
    pub success: u64,
    /// Of which did not.
    pub failure: u64,
    /// `success / total`, 0 when nothing was recorded.
    pub success_rate: f64,
    /// Mean duration, 0 when nothing was recorded.
    pub avg_duration_ms: f64,
    /// Median duration over the ring.
    pub p50_ms: u64,
    /// 99th percentile duration over the ring.
    pub p99_ms: u64,
    /// Sum of peak memory (entries that measured it).
    pub total_memory_bytes: u64,
    /// Entries the percentiles were computed from.
    pub sample: usize,
}

/// The state of the log's plumbing, for health checks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditHealth {
    /// The active file, if one is configured.
    pub file: Option<PathBuf>,
    /// Its size, counting buffered lines.
    pub file_bytes: u64,
    /// File writes, flushes or rotations that failed.
    pub write_errors: u64,
    /// Entries that did not reach the file (they stay in the ring). Counted when their
    /// write or flush failed; part of a failed flush may still have reached the file.
    pub entries_not_written: u64,
    /// The most recent file error.
    pub last_error: Option<String>,
    /// Entries refused because an entry with the same id is still in the ring.
    pub duplicates_ignored: u64,
    /// Times the `on_log` callback panicked (the panic is caught).
    pub callback_panics: u64,
}

/// The audit log without an actor: a bounded in-memory ring, an optional NDJSON file,
/// an `on_log` callback, search and statistics.
///
/// ```
/// use paddock_core::{EngineName, ExecResult, ExecutionId, Outcome};
/// use paddock_pool::audit::{AuditConfig, AuditEntry, AuditLog, AuditQuery};
///
/// let mut log = AuditLog::new(AuditConfig::default()).unwrap();
/// let mut result = ExecResult::failed(
///     ExecutionId::new(),
///     EngineName::NOOP,
///     paddock_core::Error::new(paddock_core::ErrorCode::Cancelled, "x"),
/// );
/// result.outcome = Outcome::Completed { exit_code: 0, signal: None };
/// log.record(AuditEntry::from_result(&result, Some("acme"), paddock_core::code_hash("1")));
/// assert_eq!(log.statistics().success, 1);
/// assert_eq!(log.search(&AuditQuery::default()).len(), 1);
/// ```
pub struct AuditLog {
    config: AuditConfig,
    ring: VecDeque<AuditEntry>,
    ids: HashSet<ExecutionId>,
    sink: Option<FileSink>,
    on_log: Option<OnLog>,
    totals: Totals,
    health: AuditHealth,
    access: VecDeque<OperatorAccess>,
}

#[derive(Debug, Default)]
struct Totals {
    total: u64,
    success: u64,
    duration_ms: u128,
    memory_bytes: u64,
}

impl fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditLog")
            .field("config", &self.config)
            .field("entries", &self.ring.len())
            .field("on_log", &self.on_log.as_ref().map(|_| "Fn(&AuditEntry)"))
            .field("totals", &self.totals)
            .field("health", &self.health)
            .finish()
    }
}

impl AuditLog {
    /// A log with `config`. Fails with `INVALID_CONFIG` on a bad value or a file that
    /// cannot be opened for appending.
    pub fn new(config: AuditConfig) -> Result<AuditLog, Error> {
        config.validate()?;
        let sink = match &config.file {
            None => None,
            Some(path) => Some(
                FileSink::open(path.clone(), config.max_file_bytes, config.max_files).map_err(
                    |e| {
                        Error::invalid_config(
                            "audit.file",
                            format!("cannot open `{}` for appending: {e}", path.display()),
                        )
                    },
                )?,
            ),
        };
        Ok(AuditLog {
            ring: VecDeque::with_capacity(config.ring_capacity.min(1024)),
            ids: HashSet::new(),
            health: AuditHealth {
                file: config.file.clone(),
                ..AuditHealth::default()
            },
            config,
            sink,
            on_log: None,
            totals: Totals::default(),
            access: VecDeque::new(),
        })
    }

    /// Sets the callback called once for every recorded entry, synchronously, after
    /// the entry is in the ring and handed to the file. Keep it cheap; a panic in it
    /// is caught and counted.
    pub fn set_on_log(&mut self, on_log: OnLog) {
        self.on_log = Some(on_log);
    }

    /// [`set_on_log`](AuditLog::set_on_log), builder style.
    pub fn with_on_log(mut self, on_log: OnLog) -> AuditLog {
        self.set_on_log(on_log);
        self
    }

    /// The configuration in force.
    pub fn config(&self) -> &AuditConfig {
        &self.config
    }

    /// Entries in the ring.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether the ring is empty.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Records `entry`: into the ring (dropping the oldest when full), into the file
    /// buffer, then to the callback. Returns `false`, recording nothing, when an entry
    /// with the same id is still in the ring.
    ///
    /// A file error never fails the call: the entry stays in the ring and the error
    /// shows in [`health`](AuditLog::health).
    pub fn record(&mut self, entry: AuditEntry) -> bool {
        if self.ids.contains(&entry.id) {
            self.health.duplicates_ignored += 1;
            return false;
        }
        self.totals.total += 1;
        if entry.is_success() {
            self.totals.success += 1;
        }
        self.totals.duration_ms += u128::from(entry.duration_ms);
        self.totals.memory_bytes = self.totals.memory_bytes.saturating_add(entry.memory_bytes);

        if let Some(sink) = self.sink.as_mut() {
            let mut line = serde_json::to_vec(&entry).expect("an audit entry serializes");
            line.push(b'\n');
            let written = sink.write_line(&line);
            self.note_file_result(written);
        }
        if self.ring.len() == self.config.ring_capacity {
            if let Some(old) = self.ring.pop_front() {
                self.ids.remove(&old.id);
            }
        }
        self.ids.insert(entry.id.clone());
        self.ring.push_back(entry);
        if let (Some(on_log), Some(entry)) = (&self.on_log, self.ring.back()) {
            if catch_unwind(AssertUnwindSafe(|| on_log(entry))).is_err() {
                tracing::warn!(id = %entry.id, "the audit on_log callback panicked");
                self.health.callback_panics += 1;
            }
        }
        true
    }

    /// Writes buffered lines to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        let Some(sink) = self.sink.as_mut() else {
            return Ok(());
        };
        let flushed = sink.flush();
        let out = match &flushed {
            Ok(()) => Ok(()),
            Err((e, _)) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        self.note_file_result(flushed);
        out
    }

    fn note_file_result(&mut self, result: Result<(), (io::Error, u64)>) {
        if let Some(sink) = &self.sink {
            self.health.file_bytes = sink.size();
        }
        let Err((e, lost)) = result else {
            return;
        };
        let path = self.sink.as_ref().map(|s| s.path().display().to_string());
        let message = format!("{}: {e}", path.unwrap_or_default());
        if self.health.last_error.as_deref() != Some(message.as_str()) {
            tracing::warn!(error = %message, lost, "audit file write failed; entries stay in memory");
        }
        self.health.write_errors += 1;
        self.health.entries_not_written += lost;
        self.health.last_error = Some(message);
    }

    /// Entries in the ring that match `query`, newest first (in recording order), at
    /// most `query.limit` (default [`DEFAULT_SEARCH_LIMIT`]).
    pub fn search(&self, query: &AuditQuery) -> Vec<AuditEntry> {
        self.search_for(query, None)
    }

    /// [`search`](AuditLog::search) confined to one tenant's entries when `owner` is
    /// `Some` (`Some(None)`: entries without a tenant), whatever `query.tenant` says.
    pub fn search_for(&self, query: &AuditQuery, owner: Option<Option<&str>>) -> Vec<AuditEntry> {
        let limit = query.limit.unwrap_or(DEFAULT_SEARCH_LIMIT);
        self.ring
            .iter()
            .rev()
            .filter(|e| owner.is_none_or(|o| e.tenant.as_deref() == o) && query.matches(e))
            .take(limit)
            .cloned()
            .collect()
    }

    /// [`statistics`](AuditLog::statistics) of one tenant when `owner` is `Some`:
    /// every figure then covers that tenant's entries still in the ring.
    pub fn statistics_for(&self, owner: Option<Option<&str>>) -> AuditStats {
        let Some(owner) = owner else {
            return self.statistics();
        };
        let mut totals = Totals::default();
        let mut durations = Vec::new();
        for e in self.ring.iter().filter(|e| e.tenant.as_deref() == owner) {
            totals.total += 1;
            if e.is_success() {
                totals.success += 1;
            }
            totals.duration_ms += u128::from(e.duration_ms);
            totals.memory_bytes = totals.memory_bytes.saturating_add(e.memory_bytes);
            durations.push(e.duration_ms);
        }
        durations.sort_unstable();
        stats_of(&totals, &durations)
    }

    /// Records an operator's access: into a ring of [`MAX_ACCESS_RECORDS`] and, as a
    /// line with `"kind": "operator_access"`, into the file.
    pub fn record_access(&mut self, access: OperatorAccess) {
        tracing::info!(
            operator = %access.operator,
            action = %access.action,
            target = access.target.as_deref().unwrap_or(""),
            "operator access"
        );
        if let Some(sink) = self.sink.as_mut() {
            let mut value = serde_json::to_value(&access).unwrap_or_default();
            if let Some(o) = value.as_object_mut() {
                o.insert("kind".into(), "operator_access".into());
            }
            let mut line = serde_json::to_vec(&value).unwrap_or_default();
            line.push(b'\n');
            let written = sink.write_line(&line);
            self.note_file_result(written);
        }
        if self.access.len() >= MAX_ACCESS_RECORDS {
            self.access.pop_front();
        }
        self.access.push_back(access);
    }

    /// The most recent operator accesses, newest first.
    pub fn accesses(&self, limit: usize) -> Vec<OperatorAccess> {
        self.access.iter().rev().take(limit).cloned().collect()
    }

    /// Statistics; see [`AuditStats`] for what each field covers.
    pub fn statistics(&self) -> AuditStats {
        let mut durations: Vec<u64> = self.ring.iter().map(|e| e.duration_ms).collect();
        durations.sort_unstable();
        stats_of(&self.totals, &durations)
    }

    /// The state of the file sink and the callback.
    pub fn health(&self) -> AuditHealth {
        self.health.clone()
    }
}

fn stats_of(t: &Totals, durations: &[u64]) -> AuditStats {
    let (success_rate, avg) = if t.total == 0 {
        (0.0, 0.0)
    } else {
        (
            t.success as f64 / t.total as f64,
            t.duration_ms as f64 / t.total as f64,
        )
    };
    AuditStats {
        total: t.total,
        success: t.success,
        failure: t.total - t.success,
        success_rate,
        avg_duration_ms: avg,
        p50_ms: nearest_rank(durations, 50),
        p99_ms: nearest_rank(durations, 99),
        total_memory_bytes: t.memory_bytes,
        sample: durations.len(),
    }
}

/// The nearest-rank `p`th percentile of sorted `values`; 0 when empty.
fn nearest_rank(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::nearest_rank;

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(nearest_rank(&[], 50), 0);
        assert_eq!(nearest_rank(&[10, 20, 30], 50), 20);
        assert_eq!(nearest_rank(&[10, 20, 30], 99), 30);
        assert_eq!(nearest_rank(&[7], 1), 7);
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&hundred, 50), 50);
        assert_eq!(nearest_rank(&hundred, 99), 99);
    }
}
