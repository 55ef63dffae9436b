//! Configuration: serde types with unknown fields refused, and validation that names
//! the bad field with `INVALID_CONFIG`.
//!
//! Every field has a default, so an empty file (or none at all) is a valid config.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Result};
use crate::limits::Limits;

/// The whole Paddock configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PaddockConfig {
    /// Default limits for every execution; requests may narrow or override them.
    pub limits: Limits,
    /// The subprocess engine.
    pub subprocess: SubprocessConfig,
}

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
        }
    }
}

impl PaddockConfig {
    /// Parses a TOML document and validates it.
    pub fn from_toml_str(text: &str) -> Result<PaddockConfig> {
        let config: PaddockConfig = toml::from_str(text).map_err(|e| {
            let span = e
                .span()
                .map(|s| format!(" (at byte {})", s.start))
                .unwrap_or_default();
            Error::new(
                ErrorCode::InvalidConfig,
                format!("{}{span}", e.message().trim()),
            )
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a JSON document and validates it.
    pub fn from_json_str(text: &str) -> Result<PaddockConfig> {
        let config: PaddockConfig = serde_json::from_str(text)
            .map_err(|e| Error::new(ErrorCode::InvalidConfig, e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value is usable; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        self.limits.validate("limits", true)?;
        let s = &self.subprocess;
        for (field, value) in [
            ("subprocess.python", &s.python),
            ("subprocess.node", &s.node),
            ("subprocess.shell", &s.shell),
        ] {
            if value.trim().is_empty() || value.contains('\0') {
                return Err(Error::invalid_config(
                    field,
                    "must name an interpreter (a command on PATH or an absolute path)",
                ));
            }
        }
        if let Some(root) = &s.workdir_root {
            if !root.is_absolute() {
                return Err(Error::invalid_config(
                    "subprocess.workdir_root",
                    format!("`{}` must be an absolute path", root.display()),
                ));
            }
        }
        for name in &s.env_passthrough {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(Error::invalid_config(
                    "subprocess.env_passthrough",
                    format!("`{name}` is not a valid variable name"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_document_is_the_default() {
        assert_eq!(
            PaddockConfig::from_toml_str("").unwrap(),
            PaddockConfig::default()
        );
        assert_eq!(
            PaddockConfig::from_json_str("{}").unwrap(),
            PaddockConfig::default()
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = PaddockConfig::from_toml_str("[subprocess]\npyhton = \"x\"\n").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert!(e.message.contains("pyhton"), "{}", e.message);
    }

    #[test]
    fn bad_values_name_the_field() {
        let e = PaddockConfig::from_toml_str("[limits]\ntimeout_ms = 0\n").unwrap_err();
        assert!(e.message.contains("limits.timeout_ms"), "{}", e.message);
        let e = PaddockConfig::from_toml_str("[subprocess]\nworkdir_root = \"rel\"\n").unwrap_err();
        assert!(
            e.message.contains("subprocess.workdir_root"),
            "{}",
            e.message
        );
        let e = PaddockConfig::from_toml_str("[subprocess]\ncgroup = \"maybe\"\n").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
    }

    #[test]
    fn full_document_round_trips() {
        let mut c = PaddockConfig::default();
        c.limits.timeout_ms = Some(1000);
        c.subprocess.env_passthrough = vec!["AWS_PROFILE".into()];
        c.subprocess.cgroup = CgroupMode::Off;
        let text = toml::to_string(&c).unwrap();
        assert_eq!(PaddockConfig::from_toml_str(&text).unwrap(), c);
    }
}
