//! Configuration: serde types with unknown fields refused, and validation that names
//! the bad field with `INVALID_CONFIG`.
//!
//! Every field has a default, so an empty file (or none at all) is a valid config.
//! [`PaddockConfig`] is the whole document; each of its sections has a module of its
//! own, and every type is re-exported here.

pub use crate::tenancy::LimitsConfig;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Result};
use crate::isolation::EngineName;
use crate::tenancy::AccessRules;

mod audit;
mod container;
mod egress;
mod engines;
mod isolate;
mod limiter;
mod policy;
mod pool;
mod server;
mod subprocess;

pub use audit::AuditConfig;
pub use container::{
    ContainerConfig, OciRuntime, RunscPlatform, CONTAINER_OWN_ENV, USERNS_IDS_PER_SANDBOX,
};
pub use egress::EgressConfig;
pub use engines::{EngineDef, EngineKind, MAX_ENGINE_DEFS};
pub use isolate::IsolateConfig;
pub use limiter::{LimiterConfig, DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT, MAX_EXECUTIONS_PER_WINDOW};
pub use policy::{PolicyConfig, Rule, RuleAction, RuleTarget, DEFAULT_MAX_CODE_LENGTH};
pub use pool::PoolConfig;
pub use server::{ApiKey, MetricsAccess, ServerConfig, TlsConfig};
pub use subprocess::{CgroupMode, HandlerConfig, Startup, SubprocessConfig, WarmConfig};

/// The whole Paddock configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PaddockConfig {
    /// Default limits for every execution (`[limits]`), and the operator's ceilings on
    /// what a request may ask for (`[limits.max]`).
    pub limits: LimitsConfig,
    /// The subprocess engine.
    pub subprocess: SubprocessConfig,
    /// The QuickJS isolate engine.
    pub isolate: IsolateConfig,
    /// The OCI container engine.
    pub container: ContainerConfig,
    /// Engine pools (the same settings for every engine).
    pub pool: PoolConfig,
    /// The HTTP server of `paddock serve`.
    pub server: ServerConfig,
    /// The audit log.
    pub audit: AuditConfig,
    /// Per-tenant rate and concurrency limits.
    pub limiter: LimiterConfig,
    /// The policy stage (code length cap, deny and warn rules).
    pub policy: PolicyConfig,
    /// Joining a fleet of nodes over NATS JetStream (off unless `urls` are given).
    pub fleet: crate::fleet::FleetConfig,
    /// The E2B-compatible API (off unless enabled).
    pub e2b: crate::e2b::E2bConfig,
    /// The egress gateway of sandboxes whose network is an allowlist.
    pub egress: EgressConfig,
    /// Templates of E2B sandboxes, by name; added to (or replacing) the built-in
    /// `base` and `code-interpreter-v1`.
    pub templates: std::collections::BTreeMap<String, crate::e2b::TemplateConfig>,
    /// Engines of names of their own (`[engines.NAME]`), each a built-in kind with
    /// settings of its own: a container engine with another root filesystem or
    /// runtime, say. Requests and templates choose them by name.
    pub engines: BTreeMap<EngineName, EngineDef>,
}

impl PaddockConfig {
    /// The pool slots a tenant may hold at once on this node, and whether the
    /// number is the fair share rather than set: `limiter.max_slots_per_tenant` when
    /// set; else, under API keys, an equal split of `pool.max_size` among the keys'
    /// tenants (at least 1 each), so that while one tenant holds all it may, every
    /// other still finds room in each pool; else unlimited.
    pub fn slots_per_tenant(&self) -> (Option<u32>, bool) {
        if let Some(max) = self.limiter.max_slots_per_tenant {
            return (Some(max), false);
        }
        let tenants: std::collections::BTreeSet<&str> = self
            .server
            .api_keys
            .iter()
            .map(|k| k.tenant.as_str())
            .collect();
        if tenants.is_empty() {
            return (None, false);
        }
        let share = (self.pool.max_size / tenants.len()).max(1);
        (Some(u32::try_from(share).unwrap_or(u32::MAX)), true)
    }

    /// What each tenant may use: [`ServerConfig::access_rules`], with
    /// `[egress] allow_private` as every key's default for private ranges.
    pub fn access_rules(&self) -> AccessRules {
        let mut rules = self.server.access_rules();
        if let Some(private) = self.egress.allow_private {
            // (A key's own `allow_private` still decides for its tenant.)
            rules.default.private = Some(private);
        }
        rules
    }

    /// Whether sandboxes may reach private ranges under `unrestricted`:
    /// `[egress] allow_private`, or when unset, whether the server has no API keys.
    pub fn egress_private(&self) -> bool {
        self.egress
            .allow_private
            .unwrap_or(self.server.api_keys.is_empty())
    }

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
        self.limits.validate()?;
        self.pool.validate("pool")?;
        self.server.validate()?;
        self.audit.validate()?;
        self.limiter.validate()?;
        self.isolate.validate()?;
        self.container.validate()?;
        self.fleet.validate()?;
        self.e2b.validate()?;
        self.egress.validate()?;
        if self.engines.len() > MAX_ENGINE_DEFS {
            return Err(Error::invalid_config(
                "engines",
                format!("{} engines; at most {MAX_ENGINE_DEFS}", self.engines.len()),
            ));
        }
        for (name, def) in &self.engines {
            def.validate(name, &self.container)?;
        }
        for (name, t) in &self.templates {
            crate::e2b::check_template_name(name)
                .map_err(|e| Error::invalid_config(&format!("templates.{name}"), e.message))?;
            t.validate(name)?;
            if let Some(engine) = &t.engine {
                if !EngineName::BUILT_IN.contains(engine) && !self.engines.contains_key(engine) {
                    let built_in = EngineName::BUILT_IN;
                    let known: Vec<&str> = built_in
                        .iter()
                        .chain(self.engines.keys())
                        .map(|n| n.as_str())
                        .collect();
                    return Err(Error::invalid_config(
                        &format!("templates.{name}.engine"),
                        format!(
                            "`{engine}` is no engine of this configuration; the engines are: {}",
                            known.join(", ")
                        ),
                    ));
                }
            }
        }
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
        s.warm.validate("subprocess.warm")?;
        for (name, h) in &s.handlers {
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
        check_env_names("subprocess.env_passthrough", &s.env_passthrough)?;
        Ok(())
    }
}

/// Refuses names that cannot be environment variable names (empty, or with `=` or NUL).
fn check_env_names(field: &str, names: &[String]) -> Result<()> {
    for name in names {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(Error::invalid_config(
                field,
                format!("`{name}` is not a valid variable name"),
            ));
        }
    }
    Ok(())
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
    fn env_passthrough_names_are_checked() {
        let c = PaddockConfig::from_toml_str(
            "[container]\nenv_passthrough = [\"AWS_PROFILE\", \"DATABASE_URL\"]\n",
        )
        .unwrap();
        assert_eq!(c.container.env_passthrough, ["AWS_PROFILE", "DATABASE_URL"]);
        for (doc, field) in [
            (
                "[container]\nenv_passthrough = [\"A=B\"]\n",
                "container.env_passthrough",
            ),
            (
                "[container]\nenv_passthrough = [\"\"]\n",
                "container.env_passthrough",
            ),
            (
                "[container]\nenv_passthrough = [\"PATH\"]\n",
                "container.env_passthrough",
            ),
            (
                "[subprocess]\nenv_passthrough = [\"A=B\"]\n",
                "subprocess.env_passthrough",
            ),
        ] {
            let e = PaddockConfig::from_toml_str(doc).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig, "{doc}");
            assert!(e.message.contains(field), "{doc}: {e}");
        }
        let e = ContainerConfig {
            env_passthrough: vec!["HOME".into()],
            ..ContainerConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.message.contains("`HOME`"), "{e}");
    }

    #[test]
    fn full_document_round_trips() {
        let mut c = PaddockConfig::default();
        c.limits.defaults.timeout_ms = Some(1000);
        c.subprocess.env_passthrough = vec!["AWS_PROFILE".into()];
        c.subprocess.cgroup = CgroupMode::Off;
        let text = toml::to_string(&c).unwrap();
        assert_eq!(PaddockConfig::from_toml_str(&text).unwrap(), c);
    }
}
