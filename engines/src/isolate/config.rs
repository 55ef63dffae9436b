//! The QuickJS isolate engine's settings (`[isolate]`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use paddock_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// Settings of the QuickJS isolate engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IsolateConfig {
    /// Whether the engine is enabled. Default `true`.
    pub enabled: bool,
    /// Where sandbox workdirs (the files `sandbox:fs` sees) are created. Default: the
    /// system temp dir.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir_root: Option<PathBuf>,
    /// JavaScript stack limit of each isolate, in bytes. Default 1 MiB.
    pub stack_bytes: u64,
    /// Executions after which an isolate replaces its runtime with a fresh one.
    /// Default 1000. Every execution gets a fresh context regardless.
    pub recycle_after: u32,
    /// How long an isolate thread polls for its next job before it parks, in
    /// microseconds. Default 200; 0 parks at once (saves CPU, adds a thread wake-up to
    /// each execution).
    pub idle_spin_us: u64,
    /// How long a caller polls for a fast answer before it parks, in microseconds.
    /// Default 50; switched off by itself while answers take longer.
    pub reply_spin_us: u64,
    /// Named handlers for `Invoke`: name → a JavaScript function expression, such as
    /// `"(a, b) => a * b"`. A handler name that is not listed is itself taken as the
    /// function expression.
    pub handlers: BTreeMap<String, String>,
    /// Host modules scripts may import: module name → a JSON object of named exports.
    pub modules: BTreeMap<String, serde_json::Value>,
}

impl Default for IsolateConfig {
    fn default() -> Self {
        IsolateConfig {
            enabled: true,
            workdir_root: None,
            stack_bytes: 1 << 20,
            recycle_after: 1000,
            idle_spin_us: 200,
            reply_spin_us: 50,
            handlers: BTreeMap::new(),
            modules: BTreeMap::new(),
        }
    }
}

impl IsolateConfig {
    /// Checks the ranges; module contents are checked when the engine registers them.
    pub fn validate(&self) -> Result<()> {
        let ranges: [(&str, u64, u64, u64); 4] = [
            ("isolate.stack_bytes", self.stack_bytes, 64 << 10, 256 << 20),
            (
                "isolate.recycle_after",
                u64::from(self.recycle_after),
                1,
                1_000_000,
            ),
            ("isolate.idle_spin_us", self.idle_spin_us, 0, 10_000),
            ("isolate.reply_spin_us", self.reply_spin_us, 0, 10_000),
        ];
        for (field, value, min, max) in ranges {
            if value < min || value > max {
                return Err(Error::invalid_config(
                    field,
                    format!("{value} is out of range {min}..={max}"),
                ));
            }
        }
        if let Some(root) = &self.workdir_root {
            if !root.is_absolute() {
                return Err(Error::invalid_config(
                    "isolate.workdir_root",
                    format!("`{}` must be an absolute path", root.display()),
                ));
            }
        }
        for (name, source) in &self.handlers {
            if name.is_empty() || source.trim().is_empty() || source.contains('\0') {
                return Err(Error::invalid_config(
                    "isolate.handlers",
                    format!(
                        "handler `{name}` needs a name and a function expression without NUL bytes"
                    ),
                ));
            }
        }
        Ok(())
    }
}
