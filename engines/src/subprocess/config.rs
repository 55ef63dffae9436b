//! The subprocess engine's settings (`[subprocess]`): cgroups, what it prepares at
//! start, json-stdio handlers and warm workers.

use std::collections::BTreeMap;
use std::path::PathBuf;

use paddock_core::config::check_env_names;
use paddock_core::{Error, Language, Result};
use serde::{Deserialize, Serialize};

use crate::EgressConfig;

/// How the subprocess engine uses cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupMode {
    /// Use cgroups when the host allows it, rlimits otherwise.
    #[default]
    Auto,
    /// Refuse to start without cgroups.
    Required,
    /// Never use cgroups.
    Off,
}

/// Settings of the subprocess engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubprocessConfig {
    /// Whether the engine is enabled. Default `true`.
    pub enabled: bool,
    /// Where sandbox workdirs are created. Default: the system temp dir.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir_root: Option<PathBuf>,
    /// Host environment variables passed through even if their names look secret.
    pub env_passthrough: Vec<String>,
    /// The python interpreter. Default `python3`.
    pub python: String,
    /// The JavaScript interpreter. Default `node`.
    pub node: String,
    /// The shell. Default `/bin/sh`.
    pub shell: String,
    /// Cgroup use. Default `auto`.
    pub cgroup: CgroupMode,
    /// Warm workers for `Code` (`[subprocess.warm]`).
    pub warm: WarmConfig,
    /// json-stdio handlers an `Invoke` names (`[subprocess.handlers.NAME]`): programs
    /// that speak protocol v1 on stdin/stdout and are kept running between turns.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub handlers: BTreeMap<String, HandlerConfig>,
    /// The egress gateway's settings: the top-level `[egress]`, handed to the engine
    /// when Paddock makes it (not a setting of `[subprocess]`).
    #[serde(skip)]
    pub egress: EgressConfig,
    /// What the engine probes and prepares when it starts (not a setting of the
    /// file: an embedder, or the one-shot `paddock run`, narrows it to what it will
    /// use).
    #[serde(skip)]
    pub startup: Startup,
}

/// What the subprocess engine probes and prepares when it starts. Everything by
/// default; a feature left out is not offered (absent from the capabilities, and
/// refused like any feature the host lacks), and costs nothing at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Startup {
    /// Network allowlists: one egress namespace made and its rules loaded (`nft`).
    pub egress: bool,
    /// Disk quotas (`limits.disk_bytes`, `limits.disk_files`): the backend tried.
    pub disks: bool,
    /// Sandbox homes: one mount namespace made.
    pub home: bool,
    /// Interpreters behind version-manager launchers (pyenv's shims) found at
    /// start, in a thread of their own, rather than at their first use.
    pub interpreters: bool,
}

impl Default for Startup {
    fn default() -> Self {
        Startup {
            egress: true,
            disks: true,
            home: true,
            interpreters: true,
        }
    }
}

impl Startup {
    /// Nothing probed ahead: only what a one-shot execution of a command or a
    /// snippet needs.
    pub const fn minimal() -> Startup {
        Startup {
            egress: false,
            disks: false,
            home: false,
            interpreters: false,
        }
    }
}

/// One json-stdio handler (`[subprocess.handlers.NAME]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    /// The command that starts it: `command[0]` is looked up on `PATH` (or is a path),
    /// and it runs in the sandbox workdir like any program.
    pub command: Vec<String>,
}

/// Warm workers of the subprocess engine: interpreters started ahead of need that run
/// `Code` over json-stdio, so an execution costs a frame round trip instead of an
/// interpreter start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmConfig {
    /// Run `Code` in the languages below on warm workers. Default `true`.
    pub enabled: bool,
    /// Languages with a built-in runner to keep warm. Default
    /// `["python", "javascript"]`.
    pub languages: Vec<Language>,
    /// Turns after which a worker is replaced by a fresh one; 1 gives every execution
    /// a fresh interpreter (still started ahead of need). Default 1000, the same as a
    /// pooled instance's `max_executions_per_engine`: a worker holds only its own
    /// tenant's leftovers, and `max_rss_bytes` and `max_age_ms` bound its growth.
    pub max_turns: u32,
    /// Age after which a worker is replaced, in milliseconds. Default 600,000.
    pub max_age_ms: u64,
    /// Resident memory after a turn past which the worker is replaced, in bytes.
    /// Default 256 MiB.
    pub max_rss_bytes: u64,
    /// Fork Python runners from one interpreter per engine that has the runner
    /// loaded and never runs a snippet (a fork server), instead of starting an
    /// interpreter per runner: a fresh sandbox's Python is warm at once, and its
    /// runners share the server's memory copy-on-write. Subprocess engine only; a
    /// server that cannot start falls back to starting interpreters. Default `true`.
    pub fork_server: bool,
    /// Runners a sandbox started ahead of need (before its lease) that have served
    /// no turn this long after the pool handed the sandbox out are retired, so that
    /// an open sandbox left idle holds no interpreter; its next snippet of the
    /// language starts (or forks) one. Runners in the pool's idle sandboxes are kept.
    /// The subprocess engine's and `container.runners`. Default 10,000 ms.
    pub unused_ms: u64,
}

impl WarmConfig {
    /// `INVALID_CONFIG` (naming `field`) for a worker that could never serve a turn
    /// or a language without a built-in runner.
    pub fn validate(&self, field: &str) -> Result<()> {
        if self.max_turns == 0 || self.max_age_ms == 0 || self.max_rss_bytes < (16 << 20) {
            return Err(Error::invalid_config(
                field,
                "max_turns and max_age_ms must be at least 1 and max_rss_bytes at least 16 MiB",
            ));
        }
        if let Some(lang) = self.languages.iter().find(|l| **l == Language::Shell) {
            return Err(Error::invalid_config(
                &format!("{field}.languages"),
                format!("there is no built-in warm runner for {lang}; the runners are: python, javascript"),
            ));
        }
        Ok(())
    }
}

impl Default for WarmConfig {
    fn default() -> Self {
        WarmConfig {
            enabled: true,
            languages: vec![Language::Python, Language::Javascript],
            max_turns: 1_000,
            max_age_ms: 600_000,
            max_rss_bytes: 256 << 20,
            fork_server: true,
            unused_ms: 10_000,
        }
    }
}

impl SubprocessConfig {
    /// Checks every value is usable; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("subprocess.python", &self.python),
            ("subprocess.node", &self.node),
            ("subprocess.shell", &self.shell),
        ] {
            if value.trim().is_empty() || value.contains('\0') {
                return Err(Error::invalid_config(
                    field,
                    "must name an interpreter (a command on PATH or an absolute path)",
                ));
            }
        }
        if let Some(root) = &self.workdir_root {
            if !root.is_absolute() {
                return Err(Error::invalid_config(
                    "subprocess.workdir_root",
                    format!("`{}` must be an absolute path", root.display()),
                ));
            }
        }
        self.warm.validate("subprocess.warm")?;
        for (name, h) in &self.handlers {
            let bad_name = name.is_empty()
                || name.len() > 128
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if bad_name {
                return Err(Error::invalid_config(
                    "subprocess.handlers",
                    format!(
                        "handler name `{name}` must be 1 to 128 letters, digits, `-`, `_` or `.`"
                    ),
                ));
            }
            if h.command.is_empty()
                || h.command[0].is_empty()
                || h.command.iter().any(|a| a.contains('\0'))
            {
                return Err(Error::invalid_config(
                    &format!("subprocess.handlers.{name}.command"),
                    "must name a program, with arguments free of NUL bytes",
                ));
            }
        }
        check_env_names("subprocess.env_passthrough", &self.env_passthrough)
    }
}

impl Default for SubprocessConfig {
    fn default() -> Self {
        SubprocessConfig {
            enabled: true,
            workdir_root: None,
            env_passthrough: Vec::new(),
            python: "python3".into(),
            node: "node".into(),
            shell: "/bin/sh".into(),
            cgroup: CgroupMode::Auto,
            warm: WarmConfig::default(),
            handlers: BTreeMap::new(),
            egress: EgressConfig::default(),
            startup: Startup::default(),
        }
    }
}
