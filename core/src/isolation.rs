//! Isolation levels, network policy, engine kinds and capabilities.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Result};
use crate::program::ProgramKind;

/// How strongly an engine separates a program from the host. Ordered weakest first.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationLevel {
    /// A host process with rlimits and a cgroup: resource control, no security boundary.
    #[default]
    None,
    /// A memory-safe interpreter (QuickJS) inside the host process.
    ContextIsolated,
    /// A container run by an OCI runtime: namespaces, cgroups, seccomp.
    Strict,
}

impl IsolationLevel {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            IsolationLevel::None => "none",
            IsolationLevel::ContextIsolated => "context-isolated",
            IsolationLevel::Strict => "strict",
        }
    }
}

impl fmt::Display for IsolationLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What network a program may reach. Engines fail closed: a policy an engine cannot
/// enforce is refused, never relaxed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// No network at all: an empty network namespace (loopback only, down).
    #[default]
    None,
    /// Only the listed hosts.
    Allowlist {
        /// Host names or addresses.
        hosts: Vec<String>,
    },
    /// The host's network.
    Unrestricted,
}

impl NetworkPolicy {
    /// A short name for messages and capability checks.
    pub const fn name(&self) -> &'static str {
        match self {
            NetworkPolicy::None => "none",
            NetworkPolicy::Allowlist { .. } => "allowlist",
            NetworkPolicy::Unrestricted => "unrestricted",
        }
    }
}

/// The kind of engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// Host processes.
    Subprocess,
    /// QuickJS isolates on dedicated threads.
    Isolate,
    /// OCI containers.
    Container,
    /// A test or benchmark engine that runs nothing.
    Noop,
}

impl EngineKind {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            EngineKind::Subprocess => "subprocess",
            EngineKind::Isolate => "isolate",
            EngineKind::Container => "container",
            EngineKind::Noop => "noop",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<EngineKind> {
        match s {
            "subprocess" => Some(EngineKind::Subprocess),
            "isolate" => Some(EngineKind::Isolate),
            "container" => Some(EngineKind::Container),
            "noop" => Some(EngineKind::Noop),
            _ => None,
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an engine can do. Asking for anything outside it is a typed error, never a
/// silent fallback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The strongest isolation level the engine provides; weaker requests are met.
    pub max_level: IsolationLevel,
    /// The program kinds the engine runs.
    pub programs: BTreeSet<String>,
    /// Network policies the engine can enforce, by [`NetworkPolicy::name`].
    pub network: BTreeSet<String>,
    /// Optional features: `streaming`, `files`, `cgroup`, `terminal`, `tcp`, …
    pub features: BTreeSet<String>,
}

impl Capabilities {
    /// Capabilities from lists.
    pub fn new(
        max_level: IsolationLevel,
        programs: &[ProgramKind],
        network: &[&str],
        features: &[&str],
    ) -> Capabilities {
        Capabilities {
            max_level,
            programs: programs.iter().map(|p| p.to_string()).collect(),
            network: network.iter().map(|s| s.to_string()).collect(),
            features: features.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Whether the engine runs this kind of program.
    pub fn supports_program(&self, kind: ProgramKind) -> bool {
        self.programs.contains(&kind.to_string())
    }

    /// Whether the engine advertises a feature.
    pub fn has_feature(&self, feature: &str) -> bool {
        self.features.contains(feature)
    }

    /// `CAPABILITY_NOT_SUPPORTED` unless the engine runs `kind`.
    pub fn check_program(&self, engine: EngineKind, kind: ProgramKind) -> Result<()> {
        if self.supports_program(kind) {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::CapabilityNotSupported,
            format!(
                "the {engine} engine does not run {kind}; it runs: {}",
                self.programs.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        ))
    }

    /// `CAPABILITY_NOT_SUPPORTED` unless the engine advertises `feature`.
    pub fn check_feature(&self, engine: EngineKind, feature: &str) -> Result<()> {
        if self.has_feature(feature) {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::CapabilityNotSupported,
            format!(
                "the {engine} engine, as configured, does not offer `{feature}`; it offers: {}",
                self.features.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        ))
    }

    /// `LEVEL_NOT_SUPPORTED` unless the engine provides `level` or stronger.
    pub fn check_level(&self, engine: EngineKind, level: IsolationLevel) -> Result<()> {
        if level <= self.max_level {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::LevelNotSupported,
            format!(
                "isolation level `{level}` was requested but the {engine} engine provides at most `{}`; choose an engine that provides `{level}`",
                self.max_level
            ),
        ))
    }

    /// `CAPABILITY_NOT_SUPPORTED` unless the engine can enforce `policy`.
    pub fn check_network(&self, engine: EngineKind, policy: &NetworkPolicy) -> Result<()> {
        if self.network.contains(policy.name()) {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::CapabilityNotSupported,
            format!(
                "network policy `{}` cannot be enforced by the {engine} engine on this host; it enforces: {}",
                policy.name(),
                self.network.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::Language;

    #[test]
    fn levels_are_ordered_and_checked() {
        assert!(IsolationLevel::None < IsolationLevel::ContextIsolated);
        assert!(IsolationLevel::ContextIsolated < IsolationLevel::Strict);
        let caps = Capabilities::new(
            IsolationLevel::None,
            &[ProgramKind::Command, ProgramKind::Code(Language::Python)],
            &["none"],
            &[],
        );
        assert!(caps
            .check_level(EngineKind::Subprocess, IsolationLevel::None)
            .is_ok());
        let e = caps
            .check_level(EngineKind::Subprocess, IsolationLevel::Strict)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::LevelNotSupported);
        let e = caps
            .check_program(EngineKind::Subprocess, ProgramKind::Invoke)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::CapabilityNotSupported);
        assert!(caps
            .check_network(EngineKind::Subprocess, &NetworkPolicy::Unrestricted)
            .is_err());
        assert_eq!(
            serde_json::to_string(&IsolationLevel::ContextIsolated).unwrap(),
            "\"context-isolated\""
        );
    }
}
