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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// No network at all: an empty network namespace (loopback only, down).
    #[default]
    None,
    /// Only the listed hosts and ports, through Paddock's egress gateway (see
    /// [`crate::egress`]).
    Allowlist {
        /// Host names (`pypi.org`), wildcards for the names below one
        /// (`*.pythonhosted.org`), and addresses or ranges (`198.51.100.0/24`).
        hosts: Vec<String>,
        /// The ports admitted; empty means 80 and 443.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ports: Vec<u16>,
    },
    /// The host's network.
    Unrestricted,
}

impl NetworkPolicy {
    /// Checks the policy (an allowlist's hosts and ports) and compiles an allowlist's
    /// rules; `INVALID_OPTIONS` names the bad entry under `field`.
    pub fn rules(&self, field: &str) -> Result<Option<crate::egress::EgressRules>> {
        match self {
            NetworkPolicy::Allowlist { hosts, ports } => {
                crate::egress::EgressRules::compile(&format!("{field}.allowlist"), hosts, ports)
                    .map(Some)
            }
            _ => Ok(None),
        }
    }

    /// This policy narrowed to `hosts` (names, `*.` wildcards, addresses or ranges):
    /// what both admit. `unrestricted` becomes an allowlist of `hosts` on the
    /// default ports; an allowlist, an allowlist of `hosts` on its own ports. An
    /// entry of `hosts` this policy does not admit whole (any entry, under `none`)
    /// is `INVALID_OPTIONS` naming it, as is a bad entry: a request is never
    /// silently given less than it listed. No `hosts` at all is `none`.
    pub fn narrowed_to(&self, hosts: &[String], field: &str) -> Result<NetworkPolicy> {
        if hosts.is_empty() {
            return Ok(NetworkPolicy::None);
        }
        // (What no sandbox reaches, no entry opens: the compile refuses it.)
        let wanted = crate::egress::EgressRules::compile(field, hosts, &[])?;
        let (outer, ports) = match self {
            NetworkPolicy::Unrestricted => {
                return Ok(NetworkPolicy::Allowlist {
                    hosts: hosts.to_vec(),
                    ports: Vec::new(),
                })
            }
            NetworkPolicy::None => (None, Vec::new()),
            NetworkPolicy::Allowlist {
                hosts: outer,
                ports,
            } => (
                Some(crate::egress::EgressRules::compile(field, outer, ports)?),
                ports.clone(),
            ),
        };
        for (i, rule) in wanted.hosts().iter().enumerate() {
            if !outer.as_ref().is_some_and(|o| o.admits_rule(rule)) {
                let reach = match &outer {
                    None => "no network".to_string(),
                    Some(o) => format!(
                        "an allowlist of {}",
                        o.hosts()
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                return Err(Error::invalid_options(
                    &format!("{field}[{i}]"),
                    format!(
                        "`{rule}` is beyond what this sandbox may reach ({reach}); list only what that admits, or use another template"
                    ),
                ));
            }
        }
        Ok(NetworkPolicy::Allowlist {
            hosts: wanted.hosts().iter().map(ToString::to_string).collect(),
            ports,
        })
    }

    /// A short name for messages and capability checks.
    pub const fn name(&self) -> &'static str {
        match self {
            NetworkPolicy::None => "none",
            NetworkPolicy::Allowlist { .. } => "allowlist",
            NetworkPolicy::Unrestricted => "unrestricted",
        }
    }
}

/// The name an engine is registered under, and the name requests choose it by.
///
/// Engines are open: the built-in names ([`EngineName::SUBPROCESS`],
/// [`EngineName::ISOLATE`], [`EngineName::CONTAINER`], [`EngineName::NOOP`]) are
/// ordinary entries, and an engine from any crate registers under its own name. A
/// name is 1 to 32 bytes of lower-case ASCII letters, digits, `-` and `_`, starting
/// with a letter. Cloning a name never allocates.
#[derive(Clone)]
pub struct EngineName(NameRepr);

#[derive(Clone)]
enum NameRepr {
    Static(&'static str),
    Shared(std::sync::Arc<str>),
}

/// The longest engine name, in bytes.
pub const MAX_ENGINE_NAME_LEN: usize = 32;

impl EngineName {
    /// Host processes.
    pub const SUBPROCESS: EngineName = EngineName::from_static("subprocess");
    /// QuickJS isolates on dedicated threads.
    pub const ISOLATE: EngineName = EngineName::from_static("isolate");
    /// OCI containers.
    pub const CONTAINER: EngineName = EngineName::from_static("container");
    /// A test or benchmark engine that runs nothing.
    pub const NOOP: EngineName = EngineName::from_static("noop");
    /// The names Paddock's own engines have, which no other engine may take.
    pub const BUILT_IN: [EngineName; 4] = [
        EngineName::SUBPROCESS,
        EngineName::ISOLATE,
        EngineName::CONTAINER,
        EngineName::NOOP,
    ];

    /// A name fixed at compile time. Panics (at compile time, in a `const`) when the
    /// name breaks the rules of [`EngineName`].
    pub const fn from_static(name: &'static str) -> EngineName {
        if !name_is_valid(name.as_bytes()) {
            panic!("an engine name is 1-32 bytes of a-z, 0-9, `-` and `_`, starting with a letter");
        }
        EngineName(NameRepr::Static(name))
    }

    /// Checks and takes a name given at run time, refusing one that breaks the rules
    /// with `INVALID_OPTIONS` (the message says what a name may hold).
    pub fn new(name: &str) -> Result<EngineName> {
        for builtin in [Self::SUBPROCESS, Self::ISOLATE, Self::CONTAINER, Self::NOOP] {
            if builtin.as_str() == name {
                return Ok(builtin);
            }
        }
        if !name_is_valid(name.as_bytes()) {
            let shown: String = name.chars().take(MAX_ENGINE_NAME_LEN + 8).collect();
            return Err(Error::new(
                ErrorCode::InvalidOptions,
                format!(
                    "`{shown}` is not an engine name: a name is 1 to {MAX_ENGINE_NAME_LEN} bytes of lower-case letters, digits, `-` and `_`, starting with a letter"
                ),
            ));
        }
        Ok(EngineName(NameRepr::Shared(name.into())))
    }

    /// Parses a name, `None` when it breaks the rules.
    pub fn parse(name: &str) -> Option<EngineName> {
        EngineName::new(name).ok()
    }

    /// The name as a `&'static str` when it is one (every built-in name is).
    pub fn as_static(&self) -> Option<&'static str> {
        match &self.0 {
            NameRepr::Static(s) => Some(s),
            NameRepr::Shared(_) => None,
        }
    }

    /// The name as a shared string: cloning it never allocates (a built-in name
    /// allocates once here).
    pub fn to_shared(&self) -> std::sync::Arc<str> {
        match &self.0 {
            NameRepr::Static(s) => (*s).into(),
            NameRepr::Shared(s) => s.clone(),
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            NameRepr::Static(s) => s,
            NameRepr::Shared(s) => s,
        }
    }
}

const fn name_is_valid(name: &[u8]) -> bool {
    if name.is_empty() || name.len() > MAX_ENGINE_NAME_LEN || !name[0].is_ascii_lowercase() {
        return false;
    }
    let mut i = 0;
    while i < name.len() {
        let b = name[i];
        if !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
            return false;
        }
        i += 1;
    }
    true
}

impl PartialEq for EngineName {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for EngineName {}

impl std::hash::Hash for EngineName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for EngineName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for EngineName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialEq<str> for EngineName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for EngineName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for EngineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for EngineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::str::FromStr for EngineName {
    type Err = Error;

    fn from_str(s: &str) -> Result<EngineName> {
        EngineName::new(s)
    }
}

impl Serialize for EngineName {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EngineName {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        EngineName::new(&s).map_err(|e| serde::de::Error::custom(e.message))
    }
}

/// On the wire a name is a string: [`EngineName`]'s rules as a pattern.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for EngineName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EngineName".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": ENGINE_NAME_PATTERN,
            "description": "The name an engine is registered under: `subprocess`, `isolate` and `container` are built in; an embedder may register others. A name no engine is registered under is refused with CAPABILITY_NOT_SUPPORTED.",
        })
    }
}

/// [`EngineName`]'s rules as a regular expression (for the JSON Schema of a name).
pub const ENGINE_NAME_PATTERN: &str = "^[a-z][a-z0-9_-]{0,31}$";

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
    /// The limits the engine enforces, by field name ([`crate::LIMIT_TABLE`]). A
    /// request that sets one outside this set is refused
    /// ([`Capabilities::check_limits`]); a default outside it does not apply.
    /// Every engine enforces `timeout_ms`: the scheduler holds the deadline.
    #[serde(default)]
    pub limits: BTreeSet<String>,
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
            limits: ["timeout_ms".to_string()].into(),
        }
    }

    /// These capabilities, also enforcing `limits` (field names of
    /// [`crate::LIMIT_TABLE`]).
    pub fn with_limits(mut self, limits: &[&str]) -> Capabilities {
        debug_assert!(
            limits
                .iter()
                .all(|l| crate::LIMIT_TABLE.iter().any(|s| s.name == *l)),
            "unknown limit in {limits:?}"
        );
        self.limits.extend(limits.iter().map(|l| l.to_string()));
        self
    }

    /// Whether the engine enforces the limit named `name`.
    pub fn enforces(&self, name: &str) -> bool {
        self.limits.contains(name)
    }

    /// `CAPABILITY_NOT_SUPPORTED` when `asked` sets a limit the engine cannot
    /// enforce: it would otherwise run unbounded in that respect. `prefix` names the
    /// enclosing field (`limits`).
    pub fn check_limits(
        &self,
        engine: &EngineName,
        asked: &crate::Limits,
        prefix: &str,
    ) -> Result<()> {
        match asked.set_names().find(|name| !self.enforces(name)) {
            None => Ok(()),
            Some(name) => Err(Error::new(
                ErrorCode::CapabilityNotSupported,
                format!(
                    "the {engine} engine cannot enforce `{prefix}.{name}` on this host; leave it unset, or choose an engine that enforces it (this one enforces: {})",
                    self.limits.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            )),
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
    pub fn check_program(&self, engine: &EngineName, kind: ProgramKind) -> Result<()> {
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
    pub fn check_feature(&self, engine: &EngineName, feature: &str) -> Result<()> {
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
    pub fn check_level(&self, engine: &EngineName, level: IsolationLevel) -> Result<()> {
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
    pub fn check_network(&self, engine: &EngineName, policy: &NetworkPolicy) -> Result<()> {
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

    #[test]
    fn engine_names_are_checked_and_compare_by_text() {
        let custom = EngineName::new("my-engine_2").unwrap();
        assert_eq!(custom.as_str(), "my-engine_2");
        assert_eq!(custom.as_static(), None);
        assert_eq!(
            EngineName::new("subprocess").unwrap().as_static(),
            Some("subprocess")
        );
        assert_eq!(EngineName::new("isolate").unwrap(), EngineName::ISOLATE);
        assert_eq!(EngineName::from_static("my-engine_2"), custom);
        for bad in [
            "",
            "Upper",
            "1st",
            "-x",
            "has space",
            "dot.ted",
            "é",
            &"a".repeat(33),
        ] {
            let e = EngineName::new(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidOptions, "{bad:?}");
            assert!(e.message.contains("lower-case letters"), "{}", e.message);
        }
        assert!(EngineName::new(&"a".repeat(32)).is_ok());
    }

    #[test]
    fn the_name_pattern_states_the_rules() {
        let max = MAX_ENGINE_NAME_LEN - 1;
        assert_eq!(ENGINE_NAME_PATTERN, format!("^[a-z][a-z0-9_-]{{0,{max}}}$"));
    }

    #[test]
    fn engine_names_travel_as_strings() {
        let json = serde_json::to_string(&EngineName::new("gvisor").unwrap()).unwrap();
        assert_eq!(json, "\"gvisor\"");
        let back: EngineName = serde_json::from_str(&json).unwrap();
        assert_eq!(back, "gvisor");
        let bad = serde_json::from_str::<EngineName>("\"No Such\"").unwrap_err();
        assert!(bad.to_string().contains("is not an engine name"), "{bad}");
    }
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
            .check_level(&EngineName::SUBPROCESS, IsolationLevel::None)
            .is_ok());
        let e = caps
            .check_level(&EngineName::SUBPROCESS, IsolationLevel::Strict)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::LevelNotSupported);
        let e = caps
            .check_program(&EngineName::SUBPROCESS, ProgramKind::Invoke)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::CapabilityNotSupported);
        assert!(caps
            .check_network(&EngineName::SUBPROCESS, &NetworkPolicy::Unrestricted)
            .is_err());
        assert_eq!(
            serde_json::to_string(&IsolationLevel::ContextIsolated).unwrap(),
            "\"context-isolated\""
        );
    }

    #[test]
    fn narrowing_a_policy_keeps_only_what_both_admit() {
        let hosts = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let allow = |h: &[&str], ports: Vec<u16>| NetworkPolicy::Allowlist {
            hosts: hosts(h),
            ports,
        };
        let f = "network.allowOut";
        assert_eq!(
            NetworkPolicy::None.narrowed_to(&[], f).unwrap(),
            NetworkPolicy::None
        );
        assert_eq!(
            NetworkPolicy::Unrestricted
                .narrowed_to(&hosts(&["pypi.org", "10.0.0.0/8"]), f)
                .unwrap(),
            allow(&["pypi.org", "10.0.0.0/8"], vec![])
        );
        assert_eq!(
            NetworkPolicy::Unrestricted.narrowed_to(&[], f).unwrap(),
            NetworkPolicy::None
        );
        // What unrestricted never reaches, an address rule does not open.
        for closed in [
            "0.0.0.0/0",
            "127.0.0.1",
            "169.254.169.254",
            "169.0.0.0/8",
            "::/0",
            "::1",
            "fe80::1",
            "224.0.0.1",
        ] {
            let e = NetworkPolicy::Unrestricted
                .narrowed_to(&hosts(&["pypi.org", closed]), f)
                .unwrap_err();
            assert_eq!(e.code, crate::ErrorCode::InvalidOptions, "{closed}");
            assert!(e.message.contains("hosts[1]"), "{closed}: {}", e.message);
        }
        assert!(NetworkPolicy::Unrestricted
            .narrowed_to(&hosts(&["8.8.8.0/24", "2001:db8::/32", "10.0.0.0/8"]), f)
            .is_ok());
        let outer = allow(&["*.example.org", "pypi.org", "198.51.100.0/24"], vec![443]);
        assert_eq!(
            outer
                .narrowed_to(
                    &hosts(&[
                        "api.example.org",
                        "*.cdn.example.org",
                        "PyPI.org",
                        "198.51.100.7",
                        "198.51.100.128/25",
                    ]),
                    f
                )
                .unwrap(),
            allow(
                &[
                    "api.example.org",
                    "*.cdn.example.org",
                    "pypi.org",
                    "198.51.100.7/32",
                    "198.51.100.128/25"
                ],
                vec![443]
            )
        );
        // What the policy does not admit whole is refused, naming the entry: never
        // dropped in silence.
        for (i, beyond) in ["example.org", "*.org", "198.51.0.0/16", "evil.test"]
            .into_iter()
            .enumerate()
        {
            let e = outer
                .narrowed_to(&hosts(&["pypi.org", beyond]), f)
                .unwrap_err();
            assert_eq!(e.code, crate::ErrorCode::InvalidOptions, "{i}");
            assert!(
                e.message.contains("network.allowOut[1]") && e.message.contains("beyond"),
                "{beyond}: {}",
                e.message
            );
        }
        let e = NetworkPolicy::None
            .narrowed_to(&hosts(&["*.test"]), f)
            .unwrap_err();
        assert!(e.message.contains("no network"), "{}", e.message);
        let e = outer.narrowed_to(&hosts(&["not a host"]), f).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidOptions);
        assert!(
            e.message.contains("network.allowOut.hosts[0]"),
            "{}",
            e.message
        );
    }
}
