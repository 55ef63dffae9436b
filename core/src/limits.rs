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
const CPU_MILLICORES: (u64, u64) = (10, 1 << 20);
const DISK_BYTES: (u64, u64) = (1 << 20, 1 << 46);
const DISK_FILES: (u64, u64) = (16, 1 << 32);

/// One limit of the table every engine applies: its field name, the range a value
/// must lie in (inclusive) and its built-in default (`None`: unbounded unless set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSpec {
    /// The field name, as in requests, config and [`crate::Capabilities::limits`].
    pub name: &'static str,
    /// The smallest and largest value accepted.
    pub range: (u64, u64),
    /// The value applied when neither the request nor the config sets one.
    pub default: Option<u64>,
    /// What the engines do with it, for documentation and `GET /v1/engines`.
    pub meaning: &'static str,
}

/// The limits, in the order of [`Limits::fields`]: one table of names, ranges and
/// defaults, used by validation, the ceilings, the config and the engines.
pub const LIMIT_TABLE: [LimitSpec; 10] = [
    LimitSpec {
        name: "timeout_ms",
        range: TIMEOUT_MS,
        default: Some(30_000),
        meaning: "wall-clock deadline; the execution is killed at it",
    },
    LimitSpec {
        name: "memory_bytes",
        range: MEMORY_BYTES,
        default: Some(512 << 20),
        meaning: "memory (cgroup memory and swap; address space where no cgroup)",
    },
    LimitSpec {
        name: "cpu_ms",
        range: CPU_MS,
        default: None,
        meaning: "CPU time (RLIMIT_CPU); unset, the wall clock bounds it",
    },
    LimitSpec {
        name: "cpu_millicores",
        range: CPU_MILLICORES,
        default: None,
        meaning: "CPU bandwidth in thousandths of a core (cgroup cpu.max / CFS quota)",
    },
    LimitSpec {
        name: "pids",
        range: PIDS,
        default: Some(256),
        meaning: "processes and threads (cgroup pids)",
    },
    LimitSpec {
        name: "max_output_bytes",
        range: MAX_OUTPUT_BYTES,
        default: Some(1 << 20),
        meaning: "bytes of stdout and of stderr kept, each",
    },
    LimitSpec {
        name: "file_size_bytes",
        range: FILE_SIZE_BYTES,
        default: Some(1 << 30),
        meaning: "largest file written (RLIMIT_FSIZE)",
    },
    LimitSpec {
        name: "open_files",
        range: OPEN_FILES,
        default: Some(1024),
        meaning: "open file descriptors (RLIMIT_NOFILE)",
    },
    LimitSpec {
        name: "disk_bytes",
        range: DISK_BYTES,
        default: Some(1 << 30),
        meaning: "bytes the sandbox's workdir may hold (its own filesystem)",
    },
    LimitSpec {
        name: "disk_files",
        range: DISK_FILES,
        default: Some(65_536),
        meaning: "files and directories the workdir may hold (its filesystem's inodes)",
    },
];

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
    /// CPU bandwidth in thousandths of a core (1000: one core), through the cgroup
    /// CPU controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = CPU_MILLICORES.0, max = CPU_MILLICORES.1)))]
    pub cpu_millicores: Option<u64>,
    /// Bytes the sandbox's workdir may hold; writing past it fails with `ENOSPC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = DISK_BYTES.0, max = DISK_BYTES.1)))]
    pub disk_bytes: Option<u64>,
    /// Files and directories the workdir may hold; creating more fails with `ENOSPC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = DISK_FILES.0, max = DISK_FILES.1)))]
    pub disk_files: Option<u64>,
}

impl Limits {
    /// The defaults applied when neither the request nor the config sets a limit,
    /// from [`LIMIT_TABLE`]: 30 s wall time, 1 MiB of each output stream, 512 MiB
    /// memory, 256 pids, 1 GiB file size, 1024 open files, a 1 GiB disk of at most
    /// 65,536 files, no CPU-time or CPU-bandwidth limit beyond the wall time.
    pub fn defaults() -> Limits {
        let mut limits = Limits::default();
        for (spec, field) in LIMIT_TABLE.iter().zip(limits.fields_mut()) {
            *field = spec.default;
        }
        limits
    }

    /// Every field with its name, in [`LIMIT_TABLE`]'s order.
    pub fn fields(&self) -> [(&'static str, Option<u64>); 10] {
        [
            ("timeout_ms", self.timeout_ms),
            ("memory_bytes", self.memory_bytes),
            ("cpu_ms", self.cpu_ms),
            ("cpu_millicores", self.cpu_millicores),
            ("pids", self.pids),
            ("max_output_bytes", self.max_output_bytes),
            ("file_size_bytes", self.file_size_bytes),
            ("open_files", self.open_files),
            ("disk_bytes", self.disk_bytes),
            ("disk_files", self.disk_files),
        ]
    }

    /// Every field, mutably, in [`LIMIT_TABLE`]'s order.
    pub fn fields_mut(&mut self) -> [&mut Option<u64>; 10] {
        [
            &mut self.timeout_ms,
            &mut self.memory_bytes,
            &mut self.cpu_ms,
            &mut self.cpu_millicores,
            &mut self.pids,
            &mut self.max_output_bytes,
            &mut self.file_size_bytes,
            &mut self.open_files,
            &mut self.disk_bytes,
            &mut self.disk_files,
        ]
    }

    /// The names of the fields that are set.
    pub fn set_names(&self) -> impl Iterator<Item = &'static str> {
        self.fields()
            .into_iter()
            .filter_map(|(name, v)| v.map(|_| name))
    }

    /// Fills every unset field from `base`.
    pub fn or(&self, base: &Limits) -> Limits {
        let mut out = self.clone();
        for (field, (_, b)) in out.fields_mut().into_iter().zip(base.fields()) {
            *field = field.or(b);
        }
        out
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
        for ((field, value), spec) in self.fields().into_iter().zip(LIMIT_TABLE) {
            let (min, max) = spec.range;
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
    /// The disk quota (`disk_bytes`).
    Disk,
    /// The workdir's file-count cap (`disk_files`).
    DiskFiles,
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
            LimitKind::Disk => "disk",
            LimitKind::DiskFiles => "disk_files",
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

    #[test]
    fn the_table_names_every_field_in_order() {
        let names: Vec<_> = Limits::default().fields().map(|(n, _)| n).to_vec();
        let table: Vec<_> = LIMIT_TABLE.iter().map(|s| s.name).collect();
        assert_eq!(names, table);
        // Each field set alone serializes under its table name.
        for (i, spec) in LIMIT_TABLE.iter().enumerate() {
            let mut l = Limits::default();
            *l.fields_mut()[i] = Some(spec.range.1);
            let v = serde_json::to_value(&l).unwrap();
            assert_eq!(v.as_object().unwrap().len(), 1);
            assert!(v.get(LIMIT_TABLE[i].name).is_some(), "{v}");
            assert!(l.validate("limits", false).is_ok());
            *l.fields_mut()[i] = Some(LIMIT_TABLE[i].range.1 + 1);
            let e = l.validate("limits", false).unwrap_err();
            assert!(e.message.contains(LIMIT_TABLE[i].name), "{}", e.message);
        }
        let d = Limits::defaults();
        assert_eq!(d.disk_bytes, Some(1 << 30));
        assert_eq!(d.cpu_millicores, None);
    }
}
