//! Resource limits for one execution or sandbox.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

// The range each limit must lie in (inclusive), as `Limits::validate` checks it and
// the JSON Schema states it.
const TIMEOUT_MS: (u64, u64) = (1, 24 * 3600 * 1000);
const MEMORY_BYTES: (u64, u64) = (1 << 20, 1 << 46);
const CPU_MS: (u64, u64) = (1, 24 * 3600 * 1000);
const PIDS: (u64, u64) = (1, 1 << 22);
const MAX_OUTPUT_BYTES: (u64, u64) = (0, 1 << 32);
const FILE_SIZE_BYTES: (u64, u64) = (0, 1 << 46);
const OPEN_FILES: (u64, u64) = (8, 1 << 20);

/// Resource limits. `None` means "the engine's default"; see [`Limits::or`].
///
/// Units are in the field names so that the wire form reads unambiguously.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock deadline in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = TIMEOUT_MS.0, max = TIMEOUT_MS.1)))]
    pub timeout_ms: Option<u64>,
    /// Memory limit in bytes (cgroup memory where available, address space otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = MEMORY_BYTES.0, max = MEMORY_BYTES.1)))]
    pub memory_bytes: Option<u64>,
    /// CPU time limit in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = CPU_MS.0, max = CPU_MS.1)))]
    pub cpu_ms: Option<u64>,
    /// Maximum number of processes and threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = PIDS.0, max = PIDS.1)))]
    pub pids: Option<u64>,
    /// Bytes of stdout and of stderr kept, each; the rest is dropped with a marker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = MAX_OUTPUT_BYTES.0, max = MAX_OUTPUT_BYTES.1)))]
    pub max_output_bytes: Option<u64>,
    /// Largest file the program may write, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = FILE_SIZE_BYTES.0, max = FILE_SIZE_BYTES.1)))]
    pub file_size_bytes: Option<u64>,
    /// Maximum number of open file descriptors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = OPEN_FILES.0, max = OPEN_FILES.1)))]
    pub open_files: Option<u64>,
}

impl Limits {
    /// The defaults applied when neither the request nor the config sets a limit:
    /// 30 s wall time, 1 MiB of each output stream, 512 MiB memory, 256 pids,
    /// 1 GiB file size, 1024 open files, no CPU-time limit beyond the wall time.
    pub fn defaults() -> Limits {
        Limits {
            timeout_ms: Some(30_000),
            memory_bytes: Some(512 << 20),
            cpu_ms: None,
            pids: Some(256),
            max_output_bytes: Some(1 << 20),
            file_size_bytes: Some(1 << 30),
            open_files: Some(1024),
        }
    }

    /// Fills every unset field from `base`.
    pub fn or(&self, base: &Limits) -> Limits {
        Limits {
            timeout_ms: self.timeout_ms.or(base.timeout_ms),
            memory_bytes: self.memory_bytes.or(base.memory_bytes),
            cpu_ms: self.cpu_ms.or(base.cpu_ms),
            pids: self.pids.or(base.pids),
            max_output_bytes: self.max_output_bytes.or(base.max_output_bytes),
            file_size_bytes: self.file_size_bytes.or(base.file_size_bytes),
            open_files: self.open_files.or(base.open_files),
        }
    }

    /// The wall-clock deadline as a [`Duration`].
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout_ms.map(Duration::from_millis)
    }

    /// Checks every set field is in range. `prefix` names the enclosing field in errors.
    pub fn validate(&self, prefix: &str, as_config: bool) -> Result<()> {
        let err = |field: &str, problem: &str| {
            let name = format!("{prefix}.{field}");
            if as_config {
                Error::invalid_config(&name, problem)
            } else {
                Error::invalid_options(&name, problem)
            }
        };
        let checks: [(&str, Option<u64>, (u64, u64)); 7] = [
            ("timeout_ms", self.timeout_ms, TIMEOUT_MS),
            ("memory_bytes", self.memory_bytes, MEMORY_BYTES),
            ("cpu_ms", self.cpu_ms, CPU_MS),
            ("pids", self.pids, PIDS),
            ("max_output_bytes", self.max_output_bytes, MAX_OUTPUT_BYTES),
            ("file_size_bytes", self.file_size_bytes, FILE_SIZE_BYTES),
            ("open_files", self.open_files, OPEN_FILES),
        ];
        for (field, value, (min, max)) in checks {
            if let Some(v) = value {
                if v < min || v > max {
                    return Err(err(field, &format!("{v} is out of range {min}..={max}")));
                }
            }
        }
        Ok(())
    }
}

/// Which limit ended an execution, in [`crate::Outcome::LimitExceeded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// The memory limit.
    Memory,
    /// The process count limit.
    Pids,
    /// The output cap (only when the engine is configured to kill on it).
    Output,
    /// The CPU-time limit.
    Cpu,
    /// The file size limit.
    FileSize,
}

impl LimitKind {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            LimitKind::Memory => "memory",
            LimitKind::Pids => "pids",
            LimitKind::Output => "output",
            LimitKind::Cpu => "cpu",
            LimitKind::FileSize => "file_size",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn or_fills_unset_fields_only() {
        let l = Limits {
            timeout_ms: Some(5),
            ..Limits::default()
        }
        .or(&Limits::defaults());
        assert_eq!(l.timeout_ms, Some(5));
        assert_eq!(l.max_output_bytes, Some(1 << 20));
    }

    #[test]
    fn validate_names_the_field() {
        let l = Limits {
            pids: Some(0),
            ..Limits::default()
        };
        let e = l.validate("limits", false).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidOptions);
        assert!(e.message.contains("limits.pids"), "{}", e.message);
        let e = l.validate("engines.subprocess.limits", true).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidConfig);
        assert!(Limits::defaults().validate("limits", false).is_ok());
        assert!(serde_json::from_str::<Limits>(r#"{"timeout":1}"#).is_err());
    }
}
