//! Settings of the E2B-compatible API (`[e2b]`) and of the templates its sandboxes
//! are opened from (`[templates.NAME]`).

use std::collections::BTreeMap;

use paddock_core::{EngineName, Error, IsolationLevel, Limits, NetworkPolicy, Result};
use serde::{Deserialize, Serialize};

/// The template an E2B `Sandbox.create()` opens when it names none.
pub const BASE_TEMPLATE: &str = "base";
/// The template `e2b_code_interpreter`'s `Sandbox.create()` opens.
pub const CODE_INTERPRETER_TEMPLATE: &str = "code-interpreter-v1";
/// Where E2B programs expect their home and working directory.
pub const E2B_HOME: &str = "/home/user";

/// The most sandboxes a template may keep ready.
const MAX_WARM_POOL: usize = 1024;

/// The longest `e2b.max_timeout_s`: 30 days.
const MAX_TIMEOUT_S: u64 = 30 * 86_400;

/// The E2B-compatible API (`[e2b]`): off unless enabled, then served on the native
/// API's listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct E2bConfig {
    /// Serve the E2B control plane and sandbox routes (`paddock serve --e2b` too).
    pub enabled: bool,
    /// The domain of `{port}-{sandboxID}.{domain}` host names (E2B's `E2B_DOMAIN`);
    /// requests are also routed by the `E2b-Sandbox-Id` and `E2b-Sandbox-Port`
    /// headers, which need no domain.
    pub domain: Option<String>,
    /// A sandbox's lifetime when `Sandbox.create()` gives no `timeout` (seconds).
    pub default_timeout_s: u64,
    /// The longest lifetime a sandbox may be given (seconds).
    pub max_timeout_s: u64,
    /// Most E2B sandboxes open at once, over every tenant, as a cap of the E2B
    /// surface's own on top of the pools'. Default unset: the pools decide alone
    /// (`pool.max_size` per pool, and under API keys each tenant's fair share), so
    /// that an E2B client is refused exactly when a native one would be.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sandboxes: Option<usize>,
}

impl Default for E2bConfig {
    fn default() -> Self {
        E2bConfig {
            enabled: false,
            domain: None,
            default_timeout_s: 300,
            max_timeout_s: 86_400,
            max_sandboxes: None,
        }
    }
}

impl E2bConfig {
    /// `INVALID_CONFIG` for a zero or inverted lifetime, or a domain that is not a
    /// host name.
    pub fn validate(&self) -> Result<()> {
        if self.default_timeout_s == 0 || self.max_timeout_s == 0 {
            return Err(Error::invalid_config(
                "e2b.default_timeout_s",
                "lifetimes are at least 1 s",
            ));
        }
        if self.default_timeout_s > self.max_timeout_s {
            return Err(Error::invalid_config(
                "e2b.default_timeout_s",
                format!(
                    "{} s is above e2b.max_timeout_s ({} s)",
                    self.default_timeout_s, self.max_timeout_s
                ),
            ));
        }
        if self.max_timeout_s > MAX_TIMEOUT_S {
            return Err(Error::invalid_config(
                "e2b.max_timeout_s",
                format!("at most {MAX_TIMEOUT_S} s (30 days)"),
            ));
        }
        if self.max_sandboxes == Some(0) {
            return Err(Error::invalid_config(
                "e2b.max_sandboxes",
                "caps are at least 1",
            ));
        }
        if let Some(d) = &self.domain {
            let ok = !d.is_empty()
                && d.len() <= 253
                && d.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !ok {
                return Err(Error::invalid_config(
                    "e2b.domain",
                    format!("`{d}` is not a host name such as `sandbox.example.com`"),
                ));
            }
        }
        Ok(())
    }
}

/// A template E2B sandboxes are opened from (`[templates.NAME]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TemplateConfig {
    /// The engine; unset: the container engine when it runs here, else subprocess.
    pub engine: Option<EngineName>,
    /// The isolation level required.
    pub level: IsolationLevel,
    /// The network policy.
    pub network: NetworkPolicy,
    /// Default limits of executions in the sandbox.
    pub limits: Limits,
    /// Environment variables of every process in the sandbox (a request's own win).
    pub env: BTreeMap<String, String>,
    /// The home and working directory, where the workdir is seen.
    pub home: String,
    /// Whether the sandbox serves the code interpreter (port 49999).
    pub code_interpreter: bool,
    /// Sandboxes kept ready for this template (its pool's `min_idle`, at most
    /// `pool.max_size`); unset: `pool.min_idle`.
    pub warm_pool: Option<usize>,
}

impl Default for TemplateConfig {
    fn default() -> Self {
        TemplateConfig {
            engine: None,
            level: IsolationLevel::None,
            network: NetworkPolicy::None,
            limits: Limits::default(),
            env: BTreeMap::new(),
            home: E2B_HOME.into(),
            code_interpreter: false,
            warm_pool: None,
        }
    }
}

impl TemplateConfig {
    /// `INVALID_CONFIG` for a bad home, limits or variable name.
    pub fn validate(&self, name: &str) -> Result<()> {
        let field = |f: &str| format!("templates.{name}.{f}");
        paddock_core::engine::check_home(&field("home"), &self.home)
            .map_err(|e| Error::invalid_config(&field("home"), e.message))?;
        self.limits
            .validate(&field("limits"), false)
            .map_err(|e| Error::invalid_config(&field("limits"), e.message))?;
        if self.warm_pool.is_some_and(|n| n > MAX_WARM_POOL) {
            return Err(Error::invalid_config(
                &field("warm_pool"),
                format!("at most {MAX_WARM_POOL}"),
            ));
        }
        for k in self.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(Error::invalid_config(
                    &field("env"),
                    format!("{k:?} is not a variable name"),
                ));
            }
        }
        Ok(())
    }
}

/// The templates every server has unless the configuration replaces them: `base`,
/// and `code-interpreter-v1` with the code interpreter.
pub fn builtin_templates() -> BTreeMap<String, TemplateConfig> {
    BTreeMap::from([
        (BASE_TEMPLATE.to_string(), TemplateConfig::default()),
        (
            CODE_INTERPRETER_TEMPLATE.to_string(),
            TemplateConfig {
                code_interpreter: true,
                ..TemplateConfig::default()
            },
        ),
    ])
}

/// A template name as E2B SDKs send it: 1-128 bytes of letters, digits, `-`, `_`,
/// `.`, `/` and `:` (an alias, an id, or `team/name:tag`).
pub fn check_template_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b':'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_options(
            "templateID",
            format!("{name:?} is not a template name"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        E2bConfig::default().validate().unwrap();
        for (name, t) in builtin_templates() {
            t.validate(&name).unwrap();
        }
        let e = E2bConfig {
            default_timeout_s: 10,
            max_timeout_s: 5,
            ..E2bConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.message.contains("e2b.max_timeout_s"), "{e}");
        let e = E2bConfig {
            domain: Some("bad domain".into()),
            ..E2bConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.message.contains("host name"), "{e}");
        let e = TemplateConfig {
            home: "/etc/x".into(),
            ..TemplateConfig::default()
        }
        .validate("t")
        .unwrap_err();
        assert!(e.message.contains("templates.t.home"), "{e}");
        assert!(check_template_name("team/base:v1").is_ok());
        assert!(check_template_name("bad name").is_err());
        assert!(check_template_name("").is_err());
    }
}
