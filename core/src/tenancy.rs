//! What an operator allows each tenant: ceilings on the limits a request may ask for,
//! the isolation levels and network policies it may use.
//!
//! `[limits]` in the config holds the defaults every execution gets and, in
//! `[limits.max]`, the most a request may ask for. A request above a ceiling is
//! refused with `INVALID_OPTIONS` naming the field and the bound; nothing is clamped.
//!
//! ```
//! use paddock_core::tenancy::LimitsConfig;
//! use paddock_core::Limits;
//!
//! let c: LimitsConfig = toml::from_str(
//!     "timeout_ms = 2000\n[max]\ntimeout_ms = 10000\n",
//! ).unwrap();
//! assert_eq!(c.defaults.timeout_ms, Some(2000));
//! let asked = Limits { timeout_ms: Some(86_400_000), ..Limits::default() };
//! let refusal = c.check_ceilings(&asked, "limits").unwrap_err();
//! assert!(refusal.message.contains("limits.timeout_ms"), "{}", refusal.message);
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::isolation::{IsolationLevel, NetworkPolicy};
use crate::limits::Limits;

/// The default ceiling on `max_output_bytes`: 64 MiB of each output stream. Output is
/// held in memory while an execution runs and while its result is kept, so an
/// unbounded request could make the server hold any amount.
pub const DEFAULT_MAX_OUTPUT_CEILING: u64 = 64 << 20;

/// The ceiling of `disk_bytes` when `[limits.max]` sets none: 64 GiB. A sandbox's
/// filesystem is a sparse image on the host's disk (or RAM, for tmpfs), so without
/// a ceiling one request could claim more than the host has.
pub const DEFAULT_MAX_DISK_CEILING: u64 = 64 << 30;

/// The ceiling of `disk_files` when `[limits.max]` sets none: 16 Mi files (the
/// inode tables a filesystem is made with grow with it).
pub const DEFAULT_MAX_DISK_FILES_CEILING: u64 = 16 << 20;

/// `[limits]`: defaults and ceilings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>", into = "Map<String, Value>")]
pub struct LimitsConfig {
    /// What an execution gets when its request sets nothing (the `[limits]` keys).
    pub defaults: Limits,
    /// `[limits.max]`: the most a request (or a sandbox's own limits) may ask for.
    /// Unset fields have no ceiling beyond the validation ranges, except
    /// `max_output_bytes`, whose ceiling is [`DEFAULT_MAX_OUTPUT_CEILING`] unless set
    /// (see [`LimitsConfig::ceilings`]).
    pub max: Limits,
}

impl TryFrom<Map<String, Value>> for LimitsConfig {
    type Error = String;

    fn try_from(mut map: Map<String, Value>) -> std::result::Result<Self, String> {
        let max = match map.remove("max") {
            None => Limits::default(),
            Some(v) => serde_json::from_value(v).map_err(|e| format!("limits.max: {e}"))?,
        };
        let defaults: Limits =
            serde_json::from_value(Value::Object(map)).map_err(|e| format!("limits: {e}"))?;
        Ok(LimitsConfig { defaults, max })
    }
}

impl From<LimitsConfig> for Map<String, Value> {
    fn from(c: LimitsConfig) -> Self {
        let mut map = match serde_json::to_value(&c.defaults) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        if let Ok(max) = serde_json::to_value(&c.max) {
            map.insert("max".into(), max);
        }
        map
    }
}

impl LimitsConfig {
    /// The ceilings in force: `max`, with [`DEFAULT_MAX_OUTPUT_CEILING`],
    /// [`DEFAULT_MAX_DISK_CEILING`] and [`DEFAULT_MAX_DISK_FILES_CEILING`] for
    /// `max_output_bytes`, `disk_bytes` and `disk_files` when they are unset.
    pub fn ceilings(&self) -> Limits {
        Limits {
            max_output_bytes: self
                .max
                .max_output_bytes
                .or(Some(DEFAULT_MAX_OUTPUT_CEILING)),
            disk_bytes: self.max.disk_bytes.or(Some(DEFAULT_MAX_DISK_CEILING)),
            disk_files: self.max.disk_files.or(Some(DEFAULT_MAX_DISK_FILES_CEILING)),
            ..self.max.clone()
        }
    }

    /// The defaults in force: each configured default, else the built-in one
    /// ([`Limits::defaults`]), held to its ceiling. A built-in default above an
    /// operator's ceiling becomes the ceiling, and a ceiling on a limit without a
    /// default (`cpu_ms`) becomes its default, so a request that asks for nothing
    /// never runs with more than the operator allows.
    pub fn effective_defaults(&self) -> Limits {
        let base = self.defaults.or(&Limits::defaults());
        let max = self.ceilings();
        let hold = |d: Option<u64>, m: Option<u64>| match (d, m) {
            (Some(d), Some(m)) => Some(d.min(m)),
            (None, m) => m,
            (d, None) => d,
        };
        let mut out = base.clone();
        for (field, (_, m)) in out.fields_mut().into_iter().zip(max.fields()) {
            *field = hold(*field, m);
        }
        out
    }

    /// Checks the defaults and the ceilings, and that no default is above its ceiling.
    pub fn validate(&self) -> Result<()> {
        self.defaults.validate("limits", true)?;
        self.max.validate("limits.max", true)?;
        for (field, default, max) in pairs(&self.defaults, &self.ceilings()) {
            if let (Some(d), Some(m)) = (default, max) {
                if d > m {
                    return Err(Error::invalid_config(
                        &format!("limits.{field}"),
                        format!("the default {d} is above its ceiling limits.max.{field} = {m}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Refuses `asked` when a field is above its ceiling, with `INVALID_OPTIONS`
    /// naming `{prefix}.{field}` and the bound.
    pub fn check_ceilings(&self, asked: &Limits, prefix: &str) -> Result<()> {
        check_ceilings(&self.ceilings(), asked, prefix)
    }
}

/// Refuses `asked` when a field is above its ceiling in `max`, with `INVALID_OPTIONS`
/// naming `{prefix}.{field}` and the bound.
pub fn check_ceilings(max: &Limits, asked: &Limits, prefix: &str) -> Result<()> {
    for (field, value, bound) in pairs(asked, max) {
        if let (Some(v), Some(b)) = (value, bound) {
            if v > b {
                return Err(Error::invalid_options(
                    &format!("{prefix}.{field}"),
                    format!(
                        "{v} is above the operator's ceiling {b} (limits.max.{field}); ask for at most {b}"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn pairs(a: &Limits, b: &Limits) -> impl Iterator<Item = (&'static str, Option<u64>, Option<u64>)> {
    a.fields()
        .into_iter()
        .zip(b.fields())
        .map(|((name, x), (_, y))| (name, x, y))
}

/// The kind of a [`NetworkPolicy`], as named in `allowed_networks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkKind {
    /// No network.
    None,
    /// Named hosts only.
    Allowlist,
    /// The host's network.
    Unrestricted,
}

impl NetworkKind {
    /// The kind of `policy`.
    pub fn of(policy: &NetworkPolicy) -> NetworkKind {
        match policy {
            NetworkPolicy::None => NetworkKind::None,
            NetworkPolicy::Allowlist { .. } => NetworkKind::Allowlist,
            NetworkPolicy::Unrestricted => NetworkKind::Unrestricted,
        }
    }

    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            NetworkKind::None => "none",
            NetworkKind::Allowlist => "allowlist",
            NetworkKind::Unrestricted => "unrestricted",
        }
    }
}

impl fmt::Display for NetworkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which isolation levels and network policies a tenant may use. `None` in a field
/// allows everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Allowed {
    /// The isolation levels executions and sandboxes may run at. The level checked is
    /// the one the chosen engine gives (the subprocess engine gives `none`), not the
    /// minimum a request asks for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub levels: Option<Vec<IsolationLevel>>,
    /// The network policies they may ask for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<NetworkKind>>,
}

impl Allowed {
    /// Everything allowed.
    pub fn all() -> Allowed {
        Allowed::default()
    }

    /// What a server with API keys allows when its operator said nothing: every level
    /// but `none` (a host process as Paddock's user is no boundary between tenants),
    /// every network policy but `unrestricted`.
    pub fn multi_tenant_default() -> Allowed {
        Allowed {
            levels: Some(vec![
                IsolationLevel::ContextIsolated,
                IsolationLevel::Strict,
            ]),
            networks: Some(vec![NetworkKind::None, NetworkKind::Allowlist]),
        }
    }

    /// Whether `level` is allowed.
    pub fn allows_level(&self, level: IsolationLevel) -> bool {
        self.levels.as_ref().is_none_or(|l| l.contains(&level))
    }

    /// Whether `network` is allowed.
    pub fn allows_network(&self, network: &NetworkPolicy) -> bool {
        self.networks
            .as_ref()
            .is_none_or(|n| n.contains(&NetworkKind::of(network)))
    }

    /// Fills unset fields from `base`.
    pub fn or(&self, base: &Allowed) -> Allowed {
        Allowed {
            levels: self.levels.clone().or_else(|| base.levels.clone()),
            networks: self.networks.clone().or_else(|| base.networks.clone()),
        }
    }

    /// Checks `network` for `tenant`: `INVALID_OPTIONS` naming `network` when the
    /// operator does not allow it.
    pub fn check_network(&self, network: &NetworkPolicy, tenant: Option<&str>) -> Result<()> {
        if self.allows_network(network) {
            return Ok(());
        }
        Err(Error::invalid_options(
            "network",
            format!(
                "network `{}` is not allowed for {}; allowed: {} (set by the operator in allowed_networks)",
                network.name(),
                who(tenant),
                list(self.networks.iter().flatten().map(|n| n.as_str())),
            ),
        ))
    }

    /// Checks the level an engine gives for `tenant`: `INVALID_OPTIONS` naming
    /// `level` when the operator does not allow it.
    pub fn check_level(
        &self,
        level: IsolationLevel,
        engine: &str,
        tenant: Option<&str>,
    ) -> Result<()> {
        if self.allows_level(level) {
            return Ok(());
        }
        Err(Error::invalid_options(
            "level",
            format!(
                "level `{level}` (the {engine} engine) is not allowed for {}; allowed: {} (set by the operator in allowed_levels); ask for one of them with `level` or `engine`",
                who(tenant),
                list(self.levels.iter().flatten().map(|l| l.as_str())),
            ),
        ))
    }
}

/// The [`Allowed`] of every tenant: a default, and per-tenant overrides (from the
/// API keys of `[[server.api_keys]]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRules {
    /// For tenants without an override, and callers without a tenant.
    pub default: Allowed,
    /// Per tenant; unset fields fall back to `default`.
    pub tenants: std::collections::HashMap<String, Allowed>,
}

impl AccessRules {
    /// Everything allowed for everyone.
    pub fn open() -> AccessRules {
        AccessRules::default()
    }

    /// What `tenant` may use.
    pub fn for_tenant(&self, tenant: Option<&str>) -> Allowed {
        match tenant.and_then(|t| self.tenants.get(t)) {
            Some(own) => own.or(&self.default),
            None => self.default.clone(),
        }
    }
}

fn who(tenant: Option<&str>) -> String {
    match tenant {
        Some(t) => format!("tenant `{t}`"),
        None => "callers without a tenant".to_string(),
    }
}

fn list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = items.collect();
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn disk_limits_have_a_ceiling_unless_one_is_set() {
        let c = LimitsConfig::default();
        let asked = Limits {
            disk_bytes: Some(DEFAULT_MAX_DISK_CEILING + 1),
            ..Limits::default()
        };
        let e = c.check_ceilings(&asked, "limits").unwrap_err();
        assert!(e.message.contains("limits.disk_bytes"), "{}", e.message);
        let files = Limits {
            disk_files: Some(DEFAULT_MAX_DISK_FILES_CEILING + 1),
            ..Limits::default()
        };
        assert!(c.check_ceilings(&files, "limits").is_err());
        let mut raised = LimitsConfig::default();
        raised.max.disk_bytes = Some(DEFAULT_MAX_DISK_CEILING * 2);
        assert!(raised.check_ceilings(&asked, "limits").is_ok());
        assert_eq!(c.effective_defaults().disk_bytes, Some(1 << 30));
    }

    use super::*;

    #[test]
    fn limits_config_reads_defaults_and_ceilings() {
        let c: LimitsConfig =
            toml::from_str("timeout_ms = 2000\nmemory_bytes = 67108864\n[max]\ntimeout_ms = 10000\nmemory_bytes = 134217728\n")
                .unwrap();
        assert_eq!(c.defaults.timeout_ms, Some(2000));
        assert_eq!(c.max.timeout_ms, Some(10_000));
        assert_eq!(c.max.max_output_bytes, None);
        assert_eq!(
            c.ceilings().max_output_bytes,
            Some(DEFAULT_MAX_OUTPUT_CEILING)
        );
        c.validate().unwrap();
        // Round trip through the wire form.
        let json = serde_json::to_string(&c).unwrap();
        let back: LimitsConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        // An unknown key is refused, named.
        let e = toml::from_str::<LimitsConfig>("timeout = 5\n").unwrap_err();
        assert!(e.to_string().contains("timeout"), "{e}");
        let e = toml::from_str::<LimitsConfig>("[max]\nwall = 5\n").unwrap_err();
        assert!(e.to_string().contains("limits.max"), "{e}");
    }

    #[test]
    fn built_in_defaults_are_held_to_the_ceilings() {
        let c: LimitsConfig =
            toml::from_str("[max]\ntimeout_ms = 10000\nmemory_bytes = 134217728\ncpu_ms = 1000\n")
                .unwrap();
        c.validate().unwrap();
        let d = c.effective_defaults();
        assert_eq!(d.timeout_ms, Some(10_000), "30 s built in, 10 s ceiling");
        assert_eq!(d.memory_bytes, Some(134_217_728));
        assert_eq!(
            d.cpu_ms,
            Some(1000),
            "no CPU default: the ceiling is the default"
        );
        assert_eq!(d.pids, Limits::defaults().pids, "no ceiling: the built-in");
        let mine: LimitsConfig =
            toml::from_str("timeout_ms = 2000\n[max]\ntimeout_ms = 10000\n").unwrap();
        assert_eq!(mine.effective_defaults().timeout_ms, Some(2000));
    }

    #[test]
    fn a_default_above_its_ceiling_is_refused() {
        let c: LimitsConfig = toml::from_str("pids = 100\n[max]\npids = 50\n").unwrap();
        let e = c.validate().unwrap_err();
        assert!(e.message.contains("limits.pids"), "{}", e.message);
    }

    #[test]
    fn ceilings_refuse_naming_field_and_bound() {
        let c = LimitsConfig::default();
        let ok = Limits {
            max_output_bytes: Some(DEFAULT_MAX_OUTPUT_CEILING),
            ..Limits::default()
        };
        c.check_ceilings(&ok, "limits").unwrap();
        let over = Limits {
            max_output_bytes: Some(DEFAULT_MAX_OUTPUT_CEILING + 1),
            ..Limits::default()
        };
        let e = c.check_ceilings(&over, "limits").unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidOptions);
        assert!(
            e.message.contains("limits.max_output_bytes"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains(&DEFAULT_MAX_OUTPUT_CEILING.to_string()),
            "{}",
            e.message
        );
    }

    #[test]
    fn allowed_levels_and_networks() {
        let a = Allowed::multi_tenant_default();
        assert!(!a.allows_level(IsolationLevel::None));
        assert!(a.allows_level(IsolationLevel::Strict));
        assert!(!a.allows_network(&NetworkPolicy::Unrestricted));
        assert!(a.allows_network(&NetworkPolicy::None));
        let e = a
            .check_level(IsolationLevel::None, "subprocess", Some("bob"))
            .unwrap_err();
        assert!(
            e.message.contains("`bob`") && e.message.contains("strict"),
            "{}",
            e.message
        );
        let e = a
            .check_network(&NetworkPolicy::Unrestricted, Some("bob"))
            .unwrap_err();
        assert!(e.message.contains("unrestricted"), "{}", e.message);
        assert!(Allowed::all().allows_level(IsolationLevel::None));
        let per_key = Allowed {
            levels: Some(vec![IsolationLevel::None]),
            networks: None,
        };
        let merged = per_key.or(&a);
        assert!(merged.allows_level(IsolationLevel::None));
        assert!(!merged.allows_level(IsolationLevel::Strict));
        assert!(!merged.allows_network(&NetworkPolicy::Unrestricted));
    }
}
