//! [`PaddockConfig`]: the whole configuration document, each section the type of the
//! crate it configures.
//!
//! Every field has a default, so an empty file (or none at all) is a valid config.
//! Unknown keys are refused, and validation names the bad key with `INVALID_CONFIG`.
//! The shared types and the loading machinery are `paddock-core`'s
//! ([`paddock_core::config`]); this root is the one place that names every section,
//! and it hands each layer its part: [`PaddockConfig::scheduler`] to the scheduler,
//! [`PaddockConfig::builtin`] to the built-in engines.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use paddock_core::config::LimitsConfig;
use paddock_core::{AccessRules, EngineName, Error, Result};
use paddock_e2b::{E2bConfig, TemplateConfig};
use paddock_engines::{
    BuiltinConfig, ContainerConfig, EgressConfig, EngineDef, IsolateConfig, SubprocessConfig,
    MAX_ENGINE_DEFS,
};
use paddock_fleet::FleetConfig;
use paddock_pool::audit::AuditConfig;
use paddock_pool::http::ServerConfig;
use paddock_pool::limiter::LimiterConfig;
use paddock_pool::policy::PolicyConfig;
use paddock_pool::{PoolConfig, SchedulerConfig};

#[cfg(test)]
mod tests;

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
    pub fleet: FleetConfig,
    /// The E2B-compatible API (off unless enabled).
    pub e2b: E2bConfig,
    /// The egress gateway of sandboxes whose network is an allowlist.
    pub egress: EgressConfig,
    /// Templates of E2B sandboxes, by name; added to (or replacing) the built-in
    /// `base` and `code-interpreter-v1`.
    pub templates: BTreeMap<String, TemplateConfig>,
    /// Engines of names of their own (`[engines.NAME]`), each a built-in kind with
    /// settings of its own: a container engine with another root filesystem or
    /// runtime, say. Requests and templates choose them by name.
    pub engines: BTreeMap<EngineName, EngineDef>,
}

impl PaddockConfig {
    /// The pool slots a tenant may hold at once on this node, and whether the
    /// number is the fair share rather than set (see
    /// [`SchedulerConfig::slots_per_tenant`]).
    pub fn slots_per_tenant(&self) -> (Option<u32>, bool) {
        self.scheduler().slots_per_tenant()
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

    /// What the scheduler reads: its sections, and the names of the `[engines.NAME]`
    /// engines (which requests get only by naming them).
    pub fn scheduler(&self) -> SchedulerConfig {
        SchedulerConfig {
            limits: self.limits.clone(),
            pool: self.pool.clone(),
            server: self.server.clone(),
            audit: self.audit.clone(),
            limiter: self.limiter.clone(),
            policy: self.policy.clone(),
            named_engines: self.engines.keys().cloned().collect(),
        }
    }

    /// What the built-in engines read: their sections, the effective default limits,
    /// and `[egress]` with whether private ranges are reachable decided
    /// ([`egress_private`](Self::egress_private)).
    pub fn builtin(&self) -> BuiltinConfig {
        let mut egress = self.egress.clone();
        egress.allow_private = Some(self.egress_private());
        BuiltinConfig {
            defaults: self.limits.effective_defaults(),
            subprocess: self.subprocess.clone(),
            isolate: self.isolate.clone(),
            container: self.container.clone(),
            egress,
            engines: self.engines.clone(),
        }
    }

    /// Parses a TOML document and validates it.
    pub fn from_toml_str(text: &str) -> Result<PaddockConfig> {
        let config: PaddockConfig = paddock_core::config::from_toml(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a JSON document and validates it.
    pub fn from_json_str(text: &str) -> Result<PaddockConfig> {
        let config: PaddockConfig = paddock_core::config::from_json(text)?;
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
            paddock_e2b::check_template_name(name)
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
        self.subprocess.validate()
    }
}
