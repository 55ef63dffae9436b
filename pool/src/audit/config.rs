//! The audit log's settings (`[audit]`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use paddock_core::error::{Error, Result};

/// Audit settings. Every field has a default, so `{}` keeps a 10 000-entry ring and
/// no file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Entries kept in memory for search and percentiles. Default 10 000.
    pub ring_capacity: usize,
    /// The NDJSON file to append to, for example `audit.ndjson`. Default `None`: no file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// Size at which the file is rotated, in bytes. Default 64 MiB.
    pub max_file_bytes: u64,
    /// Rotated files kept (`audit.ndjson.1` … `audit.ndjson.{max_files}`, `.1` the
    /// newest); the oldest is deleted. Default 5.
    pub max_files: u32,
    /// How often the actor flushes buffered lines to the file, in milliseconds.
    /// Default 200.
    pub flush_interval_ms: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            ring_capacity: 10_000,
            file: None,
            max_file_bytes: 64 << 20,
            max_files: 5,
            flush_interval_ms: 200,
        }
    }
}

impl AuditConfig {
    /// Checks every value; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        let ranges: [(&str, u64, u64, u64); 4] = [
            (
                "audit.ring_capacity",
                self.ring_capacity as u64,
                1,
                1_000_000,
            ),
            ("audit.max_file_bytes", self.max_file_bytes, 1024, 1 << 40),
            ("audit.max_files", u64::from(self.max_files), 1, 1000),
            ("audit.flush_interval_ms", self.flush_interval_ms, 1, 60_000),
        ];
        for (field, value, min, max) in ranges {
            if value < min || value > max {
                return Err(Error::invalid_config(
                    field,
                    format!("{value} is out of range {min}..={max}"),
                ));
            }
        }
        if let Some(path) = &self.file {
            if path.as_os_str().is_empty() || path.file_name().is_none() {
                return Err(Error::invalid_config(
                    "audit.file",
                    format!("`{}` does not name a file", path.display()),
                ));
            }
        }
        Ok(())
    }
}
