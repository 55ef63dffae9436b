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

/// The ceiling of `timeout_ms` when `[limits.max]` sets none: one hour. An
/// execution holds a pool slot and its tenant's places for as long as it runs.
pub const DEFAULT_MAX_TIMEOUT_CEILING: u64 = 3_600_000;

/// The built-in ceilings that derive from the host (when `[limits.max]` does not
/// set them): `memory_bytes` a quarter of the host's memory (at least 512 MiB),
/// `pids` a quarter of the kernel's task limit (256 to 32,768), `disk_bytes` a
/// quarter of the filesystem sandboxes' disks are made on (1 GiB to
/// [`DEFAULT_MAX_DISK_CEILING`]). A fact the host does not give falls back to
/// 16 GiB of memory, 4,096 pids and [`DEFAULT_MAX_DISK_CEILING`].
pub fn host_ceilings(host: &crate::host::HostFacts) -> Limits {
    Limits {
        memory_bytes: Some(
            host.memory_bytes
                .map_or(16 << 30, |m| (m / 4).max(512 << 20)),
        ),
        pids: Some(host.tasks.map_or(4096, |t| (t / 4).clamp(256, 32_768))),
        disk_bytes: Some(host.disk_bytes.map_or(DEFAULT_MAX_DISK_CEILING, |d| {
            (d / 4).clamp(1 << 30, DEFAULT_MAX_DISK_CEILING)
        })),
        ..Limits::default()
    }
}

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
    /// The ceilings in force on this host: [`LimitsConfig::ceilings_on`] with
    /// [`HostFacts::this_host`](crate::host::HostFacts::this_host).
    pub fn ceilings(&self) -> Limits {
        self.ceilings_on(&crate::host::HostFacts::this_host())
    }

    /// The ceilings in force on a host with `host`'s sizes: `max`, and where it
    /// sets none, the built-in ones: [`DEFAULT_MAX_OUTPUT_CEILING`],
    /// [`DEFAULT_MAX_DISK_FILES_CEILING`], [`DEFAULT_MAX_TIMEOUT_CEILING`], and
    /// [`host_ceilings`] for memory, pids and disk. A built-in ceiling is never
    /// below the operator's default for the same limit (`[limits]`), so that
    /// configuring a larger default is enough; an operator raises one with
    /// `[limits.max]`.
    pub fn ceilings_on(&self, host: &crate::host::HostFacts) -> Limits {
        let derived = host_ceilings(host);
        let built_in = |c: Option<u64>, default: Option<u64>| match (c, default) {
            (Some(c), Some(d)) => Some(c.max(d)),
            (c, _) => c,
        };
        let d = &self.defaults;
        Limits {
            max_output_bytes: self.max.max_output_bytes.or(built_in(
                Some(DEFAULT_MAX_OUTPUT_CEILING),
                d.max_output_bytes,
            )),
            disk_bytes: self
                .max
                .disk_bytes
                .or(built_in(derived.disk_bytes, d.disk_bytes)),
            disk_files: self
                .max
                .disk_files
                .or(built_in(Some(DEFAULT_MAX_DISK_FILES_CEILING), d.disk_files)),
            timeout_ms: self
                .max
                .timeout_ms
                .or(built_in(Some(DEFAULT_MAX_TIMEOUT_CEILING), d.timeout_ms)),
            memory_bytes: self
                .max
                .memory_bytes
                .or(built_in(derived.memory_bytes, d.memory_bytes)),
            pids: self.max.pids.or(built_in(derived.pids, d.pids)),
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

/// Refuses the limits `asked` of an execution in a sandbox opened with `sandbox`
/// (its own limits, or its template's) when one is above the sandbox's: a
/// sandbox's limits are the ceiling of everything that runs in it.
/// `INVALID_OPTIONS` names `{prefix}.{field}` and the sandbox's value. Its
/// `timeout_ms` is its executions' default deadline, not a ceiling (a sandbox's
/// lifetime is bounded on its own).
pub fn check_within_sandbox(sandbox: &Limits, asked: &Limits, prefix: &str) -> Result<()> {
    for (field, value, bound) in pairs(asked, sandbox) {
        if field == "timeout_ms" {
            continue;
        }
        if let (Some(v), Some(b)) = (value, bound) {
            if v > b {
                return Err(Error::invalid_options(
                    &format!("{prefix}.{field}"),
                    format!(
                        "{v} is above this sandbox's own limit {b}: an execution in a sandbox gets at most what the sandbox was opened with (or its template gives); ask for at most {b}, or open a sandbox with more"
                    ),
                ));
            }
        }
    }
    Ok(())
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
    /// Whether their allowlists may name private and shared address ranges
    /// (`10.0.0.0/8`, `192.168.1.7`, `fd00::/8`, …): `[egress] allow_private` or
    /// the key's `allow_private`. `None` allows them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private: Option<bool>,
}

impl Allowed {
    /// Everything allowed.
    pub fn all() -> Allowed {
        Allowed::default()
    }

    /// What a server with API keys allows when its operator said nothing: every level
    /// but `none` (a host process as Paddock's user is no boundary between tenants),
    /// every network policy but `unrestricted`, and allowlists of public addresses
    /// only (the private ranges are the operator's own network).
    pub fn multi_tenant_default() -> Allowed {
        Allowed {
            levels: Some(vec![
                IsolationLevel::ContextIsolated,
                IsolationLevel::Strict,
            ]),
            networks: Some(vec![NetworkKind::None, NetworkKind::Allowlist]),
            private: Some(false),
        }
    }

    /// Whether allowlists may name private and shared ranges.
    pub fn allows_private(&self) -> bool {
        self.private != Some(false)
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
            private: self.private.or(base.private),
        }
    }

    /// Checks `network` for `tenant`: `INVALID_OPTIONS` naming `network` when the
    /// operator does not allow it, or naming the entry of an allowlist that is not
    /// a well-formed rule, that reaches into a closed range (loopback, link-local,
    /// …: never allowed), or into a private range `tenant` may not reach. Every
    /// surface's sandboxes and executions pass here.
    pub fn check_network(&self, network: &NetworkPolicy, tenant: Option<&str>) -> Result<()> {
        if self.allows_network(network) {
            if let NetworkPolicy::Allowlist { hosts, ports } = network {
                crate::egress::EgressRules::compile("network.allowlist", hosts, ports)?;
                if !self.allows_private() {
                    // Entry by entry, so that the refusal names the one written.
                    for (i, host) in hosts.iter().enumerate() {
                        let one = crate::egress::EgressRules::compile(
                            "network.allowlist",
                            std::slice::from_ref(host),
                            &[],
                        )?;
                        let range = one
                            .hosts()
                            .iter()
                            .find_map(crate::egress::EgressRules::private_range_overlapped);
                        if let Some(range) = range {
                            return Err(Error::invalid_options(
                                &format!("network.allowlist.hosts[{i}]"),
                                format!(
                                    "`{}` reaches into the {} range, which {} may not reach (the operator allows it with [egress] allow_private, or allow_private on the API key); list public addresses or names",
                                    host.escape_debug(),
                                    range.as_str(),
                                    who(tenant),
                                ),
                            ));
                        }
                    }
                }
            }
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

    /// These rules with every `private` unset: what a server's `[server]` section
    /// alone decides (`[egress] allow_private` lives beside it).
    pub fn without_private(&self) -> AccessRules {
        let strip = |a: &Allowed| Allowed {
            private: None,
            ..a.clone()
        };
        AccessRules {
            default: strip(&self.default),
            tenants: self
                .tenants
                .iter()
                .map(|(t, a)| (t.clone(), strip(a)))
                .collect(),
        }
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
    fn built_in_ceilings_derive_from_the_host_and_yield_to_the_operator() {
        let host = crate::host::HostFacts {
            memory_bytes: Some(24 << 30),
            tasks: Some(32_768),
            disk_bytes: Some(100 << 30),
            cores: Some(2),
        };
        let c = LimitsConfig::default();
        let ceil = c.ceilings_on(&host);
        assert_eq!(ceil.memory_bytes, Some(6 << 30));
        assert_eq!(ceil.pids, Some(8192));
        assert_eq!(ceil.disk_bytes, Some(25 << 30));
        assert_eq!(ceil.timeout_ms, Some(DEFAULT_MAX_TIMEOUT_CEILING));
        // The probe's request: 64 GiB of memory and disk, 4 M pids, 24 h.
        let asked = Limits {
            memory_bytes: Some(64 << 30),
            disk_bytes: Some(64 << 30),
            pids: Some(4 << 20),
            timeout_ms: Some(86_400_000),
            ..Limits::default()
        };
        for field in ["memory_bytes", "disk_bytes", "pids", "timeout_ms"] {
            let mut one = Limits::default();
            for (slot, (name, v)) in one.fields_mut().into_iter().zip(asked.fields()) {
                if name == field {
                    *slot = v;
                }
            }
            let e = check_ceilings(&ceil, &one, "limits").unwrap_err();
            assert!(
                e.message.contains(&format!("limits.{field}")),
                "{}",
                e.message
            );
        }
        // Unknown facts: fixed fallbacks; tiny hosts: the floors.
        let none = c.ceilings_on(&crate::host::HostFacts::default());
        assert_eq!(none.memory_bytes, Some(16 << 30));
        assert_eq!(none.pids, Some(4096));
        assert_eq!(none.disk_bytes, Some(DEFAULT_MAX_DISK_CEILING));
        let tiny = crate::host::HostFacts {
            memory_bytes: Some(1 << 30),
            tasks: Some(512),
            disk_bytes: Some(1 << 30),
            cores: Some(1),
        };
        let t = c.ceilings_on(&tiny);
        assert_eq!(
            (t.memory_bytes, t.pids, t.disk_bytes),
            (Some(512 << 20), Some(256), Some(1 << 30))
        );
        // The operator raises one, and a larger default raises its built-in one.
        let raised: LimitsConfig = toml::from_str(
            "pids = 20000
[max]
memory_bytes = 68719476736
",
        )
        .unwrap();
        let r = raised.ceilings_on(&host);
        assert_eq!(r.memory_bytes, Some(64 << 30));
        assert_eq!(r.pids, Some(20_000));
        raised.validate().unwrap();
    }

    #[test]
    fn a_default_above_its_ceiling_is_refused() {
        let c: LimitsConfig = toml::from_str("pids = 100\n[max]\npids = 50\n").unwrap();
        let e = c.validate().unwrap_err();
        assert!(e.message.contains("limits.pids"), "{}", e.message);
    }

    #[test]
    fn a_sandboxs_limits_are_the_ceiling_of_its_executions() {
        let sandbox = Limits {
            memory_bytes: Some(512 << 20),
            pids: Some(64),
            timeout_ms: Some(1_000),
            ..Limits::default()
        };
        let asked = Limits {
            memory_bytes: Some(4 << 30),
            ..Limits::default()
        };
        let e = check_within_sandbox(&sandbox, &asked, "limits").unwrap_err();
        assert!(
            e.message.contains("limits.memory_bytes") && e.message.contains("536870912"),
            "{}",
            e.message
        );
        let within = Limits {
            memory_bytes: Some(256 << 20),
            pids: Some(64),
            // A deadline past the sandbox's default one, and a limit it left unset.
            timeout_ms: Some(60_000),
            cpu_millicores: Some(500),
            ..Limits::default()
        };
        assert!(check_within_sandbox(&sandbox, &within, "limits").is_ok());
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
            private: Some(true),
        };
        let merged = per_key.or(&a);
        assert!(merged.allows_level(IsolationLevel::None));
        assert!(!merged.allows_level(IsolationLevel::Strict));
        assert!(!merged.allows_network(&NetworkPolicy::Unrestricted));
        // Private ranges: refused by the multi-tenant default, allowed per key.
        let private = NetworkPolicy::Allowlist {
            hosts: vec!["pypi.org".into(), "10.1.0.0/16".into()],
            ports: vec![],
        };
        let e = a.check_network(&private, Some("bob")).unwrap_err();
        assert!(
            e.message.contains("network.allowlist.hosts[1]") && e.message.contains("allow_private"),
            "{}",
            e.message
        );
        assert!(merged.check_network(&private, Some("bob")).is_ok());
        // The refusal names the entry as written, duplicates before it or not.
        let dup = NetworkPolicy::Allowlist {
            hosts: vec!["pypi.org".into(), "PyPI.org".into(), "10.0.0.1".into()],
            ports: vec![],
        };
        let e = a.check_network(&dup, Some("bob")).unwrap_err();
        assert!(
            e.message.contains("hosts[2]") && e.message.contains("`10.0.0.1`"),
            "{}",
            e.message
        );
        assert!(Allowed::all().check_network(&private, None).is_ok());
    }
}
