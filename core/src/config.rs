//! Configuration: serde types with unknown fields refused, and validation that names
//! the bad field with `INVALID_CONFIG`.
//!
//! Every field has a default, so an empty file (or none at all) is a valid config.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Result};
use crate::isolation::{EngineName, IsolationLevel};
use crate::program::Language;
pub use crate::tenancy::LimitsConfig;
use crate::tenancy::{AccessRules, Allowed, NetworkKind};

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

/// The most engines `[engines]` may define.
pub const MAX_ENGINE_DEFS: usize = 16;

/// The kinds of built-in engine an `[engines.NAME]` section can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// An OCI container engine: `[container]`'s settings, with the section's own in
    /// their place.
    Container,
}

/// An engine of a name of its own (`[engines.NAME]`).
///
/// It has every setting of its kind's section (`[container]`) except those it sets
/// itself, and it runs whether or not that section's own engine is enabled. Its
/// executions and sandboxes are its own: pools, workdirs, cgroups and the audit's
/// `engine` field carry its name. An execution or sandbox gets it only by naming it
/// (a request's `engine`, a template's `engine`); a request that names none is never
/// routed to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineDef {
    /// The kind of engine: `container`.
    pub kind: EngineKind,
    /// The containers' root filesystem, used read-only: an unpacked image (a
    /// directory with `bin/sh`, say, from `docker export` or `umoci unpack`). Unset:
    /// `container.rootfs`, else the generated root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,
    /// The OCI runtime. Unset: `container.runtime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<OciRuntime>,
    /// The runtime binary. Unset: `container.runtime_path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_path: Option<PathBuf>,
    /// runsc's platform. Unset: `container.runsc_platform`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runsc_platform: Option<RunscPlatform>,
    /// The CPU quota per container. Unset: `container.cpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Host variables the containers receive. Unset: `container.env_passthrough`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_passthrough: Option<Vec<String>>,
}

impl EngineDef {
    /// The container settings of this engine: `base` with the section's own in
    /// their place, enabled.
    pub fn container_config(&self, base: &ContainerConfig) -> ContainerConfig {
        let mut c = base.clone();
        c.enabled = true;
        if let Some(r) = &self.rootfs {
            c.rootfs = Some(r.clone());
        }
        if let Some(r) = self.runtime {
            c.runtime = r;
        }
        if let Some(p) = &self.runtime_path {
            c.runtime_path = Some(p.clone());
        }
        if let Some(p) = self.runsc_platform {
            c.runsc_platform = p;
        }
        if let Some(n) = self.cpus {
            c.cpus = n;
        }
        if let Some(e) = &self.env_passthrough {
            c.env_passthrough = e.clone();
        }
        c
    }

    /// `INVALID_CONFIG`, naming `engines.NAME.FIELD`, for a setting its kind would
    /// refuse (the same checks as `[container]`'s).
    pub fn validate(&self, name: &EngineName, base: &ContainerConfig) -> Result<()> {
        let field = format!("engines.{name}");
        if EngineName::BUILT_IN.contains(name) {
            return Err(Error::invalid_config(
                &field,
                format!(
                    "`{name}` is a built-in engine's name; give this engine another (the built-in ones are configured in their own sections, such as [container])"
                ),
            ));
        }
        match self.kind {
            EngineKind::Container => self.container_config(base).validate().map_err(|e| {
                // "`container.rootfs`: ..." reads "`engines.NAME.rootfs`: ...".
                let message = e.message.replacen("`container.", &format!("`{field}."), 1);
                Error::new(e.code, message)
            }),
        }
    }
}

/// Audit settings. Every field has a default, so `{}` keeps a 10 000-entry ring and
/// no file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Entries kept in memory for search and percentiles. Default 10 000.
    pub ring_capacity: usize,
    /// The NDJSON file to append to, for example `audit.ndjson`. Default `None`: no file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// Size at which the file is rotated, in bytes. Default 64 MiB.
    pub max_file_bytes: u64,
    /// Rotated files kept (`audit.ndjson.1` … `audit.ndjson.{max_files}`, `.1` the
    /// newest); the oldest is deleted. Default 5.
    pub max_files: u32,
    /// How often the actor flushes buffered lines to the file, in milliseconds.
    /// Default 200.
    pub flush_interval_ms: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            ring_capacity: 10_000,
            file: None,
            max_file_bytes: 64 << 20,
            max_files: 5,
            flush_interval_ms: 200,
        }
    }
}

impl AuditConfig {
    /// Checks every value; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        let ranges: [(&str, u64, u64, u64); 4] = [
            (
                "audit.ring_capacity",
                self.ring_capacity as u64,
                1,
                1_000_000,
            ),
            ("audit.max_file_bytes", self.max_file_bytes, 1024, 1 << 40),
            ("audit.max_files", u64::from(self.max_files), 1, 1000),
            ("audit.flush_interval_ms", self.flush_interval_ms, 1, 60_000),
        ];
        for (field, value, min, max) in ranges {
            if value < min || value > max {
                return Err(Error::invalid_config(
                    field,
                    format!("{value} is out of range {min}..={max}"),
                ));
            }
        }
        if let Some(path) = &self.file {
            if path.as_os_str().is_empty() || path.file_name().is_none() {
                return Err(Error::invalid_config(
                    "audit.file",
                    format!("`{}` does not name a file", path.display()),
                ));
            }
        }
        Ok(())
    }
}

/// The egress gateway (`[egress]`): what every sandbox whose network is an
/// allowlist gets, on the engines that enforce allowlists (see `docs/security.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// The resolvers asked for admitted names, as `IP` or `IP:PORT`. Default: none
    /// given, the host's (`/etc/resolv.conf`).
    pub resolvers: Vec<String>,
    /// How long one resolver may take to answer, in milliseconds. Default 3 000.
    pub resolve_timeout_ms: u64,
    /// Connections one sandbox may hold open through the gateway at once; more are
    /// refused (503 from the proxy, a reset on the transparent path). Default 64.
    pub max_connections: u32,
    /// How long a dial of an admitted host may take, in milliseconds. Default 5 000.
    pub connect_timeout_ms: u64,
    /// Whether sandboxes reach private and shared address ranges (`10.0.0.0/8`,
    /// `172.16.0.0/12`, `192.168.0.0/16`, `100.64.0.0/10`, `fc00::/7`): the
    /// operator's own network. When allowed, an allowlist may name them (an API
    /// key's `allow_private` decides for its tenant) and `unrestricted` reaches
    /// them. Default: allowed on a server without API keys, refused with them.
    /// Loopback, link-local (the cloud metadata address), multicast, reserved
    /// ranges and the host's own addresses are never reached, whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_private: Option<bool>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            resolvers: Vec::new(),
            resolve_timeout_ms: 3_000,
            max_connections: 64,
            connect_timeout_ms: 5_000,
            allow_private: None,
        }
    }
}

impl EgressConfig {
    /// The resolvers, parsed (port 53 where none is given).
    pub fn resolver_addrs(&self) -> Result<Vec<std::net::SocketAddr>> {
        self.resolvers
            .iter()
            .enumerate()
            .map(|(i, r)| {
                r.parse::<std::net::SocketAddr>()
                    .or_else(|_| r.parse::<std::net::IpAddr>().map(|ip| (ip, 53).into()))
                    .map_err(|_| {
                        Error::invalid_config(
                            &format!("egress.resolvers[{i}]"),
                            format!("`{r}` is not an IP address or IP:PORT (for example 192.0.2.53 or 192.0.2.53:5353)"),
                        )
                    })
            })
            .collect()
    }

    /// Checks every value; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        if self.resolvers.len() > 8 {
            return Err(Error::invalid_config(
                "egress.resolvers",
                format!("{} resolvers; give at most 8", self.resolvers.len()),
            ));
        }
        self.resolver_addrs()?;
        let ranges: [(&str, u64, u64, u64); 3] = [
            (
                "egress.resolve_timeout_ms",
                self.resolve_timeout_ms,
                100,
                60_000,
            ),
            (
                "egress.max_connections",
                u64::from(self.max_connections),
                1,
                4_096,
            ),
            (
                "egress.connect_timeout_ms",
                self.connect_timeout_ms,
                100,
                60_000,
            ),
        ];
        for (field, value, min, max) in ranges {
            if value < min || value > max {
                return Err(Error::invalid_config(
                    field,
                    format!("{value} is out of range {min}..={max}"),
                ));
            }
        }
        Ok(())
    }
}

/// Most admissions `max_executions_per_window` may allow.
pub const MAX_EXECUTIONS_PER_WINDOW: u32 = 1_000_000;

/// Limiter settings. Every field has a default, so `{}` limits nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimiterConfig {
    /// Admissions a tenant may have in any window. Default `None`: unlimited.
    pub max_executions_per_window: Option<u32>,
    /// The window's length in milliseconds. Default 60 000.
    pub window_ms: u64,
    /// Permits a tenant may hold at once. Default `None`: unlimited.
    pub max_concurrent_per_tenant: Option<u32>,
    /// Permits all tenants together may hold at once. Default `None`: unlimited.
    pub max_concurrent: Option<u32>,
    /// Sandboxes a tenant may have open at once (counting ones being opened); more
    /// are refused with `RATE_LIMITED`. Default `None`: unlimited.
    pub max_sandboxes_per_tenant: Option<u32>,
    /// Pool slots a tenant may hold at once: each open sandbox holds one for its
    /// life, each pooled execution one while it waits or runs (executions inside a
    /// sandbox use the sandbox's). More are refused with `POOL_EXHAUSTED`. Counted
    /// across every engine's pool. Default `None`: unlimited.
    pub max_slots_per_tenant: Option<u32>,
    /// Tenants tracked at most. Default 100 000.
    pub max_tenants: usize,
    /// The `retry_after_ms` hint given for a concurrency refusal. Default 100.
    pub busy_retry_after_ms: u64,
    /// Bytes of output a tenant's running executions keep at once, across all of
    /// them (their stdout and stderr, held for their results). Past it, further
    /// output of that tenant's executions is cut as at the output cap (truncation
    /// marker, `stdout_truncated`/`stderr_truncated`, a warning); other tenants are
    /// not affected. Default 134217728 (128 MiB: one execution at the default
    /// 64 MiB ceiling on both streams); at most 2^50.
    pub max_output_bytes_per_tenant: u64,
    /// Bytes of input that may wait for one background process or terminal: written
    /// by callers (E2B `SendInput`, `write_stdin`, an attach socket), not yet read by
    /// it. A write that finds no room waits up to `input_wait_ms`, then is refused
    /// with `RATE_LIMITED`. Default 1048576 (1 MiB); 1 to 1073741824.
    pub max_input_bytes_per_process: u64,
    /// Bytes of input that may wait for all of a tenant's processes together,
    /// counting writes still waiting for room; a write past it is refused at once
    /// with `RATE_LIMITED`. Default 16777216 (16 MiB); at least
    /// `max_input_bytes_per_process`, at most 2^50.
    pub max_input_bytes_per_tenant: u64,
    /// How long a write waits for room in a process's input buffer, in milliseconds.
    /// Default 5000; 0 (refused at once) to 600000.
    pub input_wait_ms: u64,
}

/// Default `limiter.max_output_bytes_per_tenant`.
pub const DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT: u64 = 128 << 20;

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            max_executions_per_window: None,
            window_ms: 60_000,
            max_concurrent_per_tenant: None,
            max_concurrent: None,
            max_sandboxes_per_tenant: None,
            max_slots_per_tenant: None,
            max_tenants: 100_000,
            busy_retry_after_ms: 100,
            max_output_bytes_per_tenant: DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT,
            max_input_bytes_per_process: crate::input::DEFAULT_INPUT_BUFFER as u64,
            max_input_bytes_per_tenant: 16 << 20,
            input_wait_ms: crate::input::DEFAULT_INPUT_WAIT.as_millis() as u64,
        }
    }
}

impl LimiterConfig {
    /// Checks every value; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        if self.window_ms == 0 || self.window_ms > 7 * 24 * 3600 * 1000 {
            return Err(Error::invalid_config(
                "limiter.window_ms",
                format!("{} is out of range 1..=604800000", self.window_ms),
            ));
        }
        if let Some(n) = self.max_executions_per_window {
            if n == 0 || n > MAX_EXECUTIONS_PER_WINDOW {
                return Err(Error::invalid_config(
                    "limiter.max_executions_per_window",
                    format!(
                        "{n} is out of range 1..={MAX_EXECUTIONS_PER_WINDOW}; leave it unset for no rate limit"
                    ),
                ));
            }
        }
        for (field, value) in [
            (
                "limiter.max_concurrent_per_tenant",
                self.max_concurrent_per_tenant,
            ),
            ("limiter.max_concurrent", self.max_concurrent),
            (
                "limiter.max_sandboxes_per_tenant",
                self.max_sandboxes_per_tenant,
            ),
            ("limiter.max_slots_per_tenant", self.max_slots_per_tenant),
        ] {
            if value == Some(0) {
                return Err(Error::invalid_config(
                    field,
                    "must be at least 1; leave it unset for no cap",
                ));
            }
        }
        if self.max_tenants == 0 {
            return Err(Error::invalid_config(
                "limiter.max_tenants",
                "must be at least 1",
            ));
        }
        if self.busy_retry_after_ms == 0 {
            return Err(Error::invalid_config(
                "limiter.busy_retry_after_ms",
                "must be at least 1",
            ));
        }
        self.validate_memory()
    }

    /// The memory budgets: output and input per tenant, input per process.
    fn validate_memory(&self) -> Result<()> {
        use crate::budget::MAX_BUDGET_BYTES;
        let per_process = self.max_input_bytes_per_process;
        for (field, v, min, max) in [
            (
                "limiter.max_output_bytes_per_tenant",
                self.max_output_bytes_per_tenant,
                1,
                MAX_BUDGET_BYTES,
            ),
            (
                "limiter.max_input_bytes_per_process",
                per_process,
                1,
                1 << 30,
            ),
            (
                "limiter.max_input_bytes_per_tenant",
                self.max_input_bytes_per_tenant,
                per_process,
                MAX_BUDGET_BYTES,
            ),
            ("limiter.input_wait_ms", self.input_wait_ms, 0, 600_000),
        ] {
            if !(min..=max).contains(&v) {
                return Err(Error::invalid_config(
                    field,
                    format!("{v} is out of range {min}..={max}"),
                ));
            }
        }
        Ok(())
    }

    /// The input limits of a process of `tenant`, whose budget is drawn from
    /// `budgets` (made with [`max_input_bytes_per_tenant`](Self::max_input_bytes_per_tenant)).
    pub fn input_limits(
        &self,
        budgets: &crate::budget::TenantBudgets,
        tenant: Option<&str>,
    ) -> crate::input::InputLimits {
        crate::input::InputLimits {
            buffer_bytes: usize::try_from(self.max_input_bytes_per_process).unwrap_or(usize::MAX),
            wait: std::time::Duration::from_millis(self.input_wait_ms),
            tenant: Some(budgets.for_tenant(tenant)),
        }
    }
}

/// The default `max_code_length` of the policy stage.
pub const DEFAULT_MAX_CODE_LENGTH: usize = 100_000;

/// Policy settings. Every field has a default, so `{}` is the built-in policy.
///
/// ```
/// use paddock_core::config::PolicyConfig;
///
/// let c: PolicyConfig = serde_json::from_str(r#"{
///     "max_code_length": 20000,
///     "disable": ["warn-while-true"],
///     "custom_rules": [{
///         "name": "no-curl",
///         "target": "command",
///         "pattern": "(^| )curl( |$)",
///         "message": "no network fetches from commands"
///     }]
/// }"#).unwrap();
/// assert_eq!(c.custom_rules[0].name, "no-curl");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Longest accepted program, in bytes of UTF-8 source (or of the argv joined by
    /// spaces for a command). Default 100 000.
    pub max_code_length: usize,
    /// Names of built-in rules to turn off. Default: none. A name that is not a
    /// built-in rule is refused, so a typo cannot silently leave a rule on.
    pub disable: Vec<String>,
    /// Rules checked after the built-in ones. Default: none.
    pub custom_rules: Vec<Rule>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            max_code_length: DEFAULT_MAX_CODE_LENGTH,
            disable: Vec::new(),
            custom_rules: Vec::new(),
        }
    }
}

/// What a matching rule does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Refuse the program with `CODE_BLOCKED`. The default.
    #[default]
    Block,
    /// Run the program and add a warning to its result.
    Warn,
}

/// Which text of a program a rule reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleTarget {
    /// The source of a `Code` program. The default.
    #[default]
    Code,
    /// The argv of a `Command` program, joined by single spaces.
    Command,
}

/// One deny or warn rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// A unique name, reported in refusals and warnings: lowercase ASCII letters,
    /// digits, `-`, `_` and `.`, at most 64 characters.
    pub name: String,
    /// For `RuleTarget::Code`: the language the rule applies to; absent means every
    /// language. Must be absent for `RuleTarget::Command`.
    #[serde(default)]
    pub language: Option<Language>,
    /// What the rule reads. Default `RuleTarget::Code`.
    #[serde(default)]
    pub target: RuleTarget,
    /// A regular expression (`regex` crate syntax) searched for anywhere in the text.
    pub pattern: String,
    /// What a match does. Default `RuleAction::Block`.
    #[serde(default)]
    pub action: RuleAction,
    /// What is wrong, for the caller. Default: a mention of the pattern.
    #[serde(default)]
    pub message: String,
}

/// Settings of the HTTP server (`paddock serve`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on. Default `127.0.0.1:7878`; port 0 picks a free port.
    pub listen: String,
    /// API keys and the tenant each one stands for. Empty (the default) turns
    /// authentication off; the tenant then comes from the `X-Paddock-Tenant` header.
    pub api_keys: Vec<ApiKey>,
    /// Isolation levels every tenant may use, unless its key says otherwise.
    /// Default: every level without API keys; every level but `none` with them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_levels: Option<Vec<IsolationLevel>>,
    /// Network policies every tenant may ask for, unless its key says otherwise.
    /// Default: every policy without API keys; every policy but `unrestricted` with
    /// them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_networks: Option<Vec<NetworkKind>>,
    /// Largest JSON request body, in bytes. Default 1 MiB.
    pub max_body_bytes: usize,
    /// Largest file upload, in bytes. Default 64 MiB.
    pub max_file_bytes: usize,
    /// How long finished results stay available by id and idempotency key, in
    /// seconds. Default 600.
    pub result_retention_s: u64,
    /// Most results kept at once. Default 10000.
    pub max_results: usize,
    /// Bytes of kept results (output, values, messages) for all tenants together;
    /// the oldest are dropped first. Default 256 MiB.
    pub max_result_bytes: u64,
    /// Bytes of kept results per tenant; a tenant over it loses its own oldest
    /// results, never another tenant's. A single result larger than this is kept
    /// without its output (a warning says so). Default 64 MiB.
    pub max_result_bytes_per_tenant: u64,
    /// Requests a tenant may have in progress at once, streamed responses and open
    /// WebSockets included; more are answered 429 `RATE_LIMITED`. Default 256.
    pub max_requests_per_tenant: u32,
    /// WebSockets (attach, TCP) a tenant may have open at once; more are answered
    /// 429 `RATE_LIMITED`. Default 64.
    pub max_websockets_per_tenant: u32,
    /// How long a connection the server is closing waits for its client before it is
    /// dropped, in milliseconds. Default 100. A WebSocket the server closes ends this
    /// long after its close frame at most (usually at once). An answer given before a
    /// request's body was read (a 413 for an upload over the limit, a 401) is
    /// followed by this long a wait while the client may still be sending; a client
    /// that sends past it may see a reset instead of the answer, so raise it for
    /// clients that upload large files slowly and do not send `Expect: 100-continue`.
    /// At most 60000.
    pub close_linger_ms: u64,
    /// How long a new connection has to send its first request's head (request line
    /// and headers), in milliseconds; past it the server answers 408 and closes the
    /// connection. Default 5000; 1 to 600000. (Later requests on a kept-alive
    /// connection are bounded by the keep-alive timer until their first byte, and, on
    /// a connection that has presented no credential, by
    /// `max_unauthenticated_connections`.)
    pub header_read_timeout_ms: u64,
    /// How long a request body may go without a byte arriving while the server reads
    /// it, in milliseconds; past it the request is answered 408 `TIMEOUT` and its
    /// connection closed. Default 30000; 1 to 3600000. WebSockets and E2B Connect
    /// client streams (`process.Process/StreamInput`) are long-lived by design and
    /// not bounded by it.
    pub body_read_timeout_ms: u64,
    /// Connections that have not yet presented a valid credential (an API key, or a
    /// sandbox's access token; without API keys, any request), across all clients;
    /// past it the oldest such connection is closed to make room. Default 4096.
    pub max_unauthenticated_connections: u32,
    /// Connections without a valid credential from one client address (one IPv6
    /// /64); past it that address's oldest such connection is closed. Default 256; at
    /// most `max_unauthenticated_connections`.
    pub max_unauthenticated_connections_per_address: u32,
    /// Where `/metrics` is served: `"api"` (the default) on the API's address to
    /// anyone, `"operator"` on the API's address to operator keys only, or an
    /// `ADDR:PORT` of its own (then not on the API's address at all).
    pub metrics: String,
    /// How long a graceful shutdown lets running executions finish, in ms. Default 10000.
    pub drain_ms: u64,
    /// Refuse to start when an enabled engine cannot run on this host (a container
    /// engine without a usable OCI runtime, say), instead of serving without it.
    /// Default `false`: the server starts, says which engine is missing and why,
    /// and refuses requests and templates that need it (never running them on a
    /// weaker engine).
    pub require_engines: bool,
    /// HTTP worker threads. Default 2.
    pub workers: usize,
    /// A second listener that serves the same routes over TLS (`[server.tls]`), for
    /// clients that reach the server by `https://` names: E2B's SDKs with
    /// `E2B_DOMAIN`, say. Default: none (only `listen`, plain HTTP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

/// The TLS listener of the server (`[server.tls]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Address to listen on, such as `0.0.0.0:443`; port 0 picks a free port.
    pub listen: String,
    /// The certificate chain, PEM, the server's own certificate first (a
    /// `fullchain.pem`). For the E2B domain mode it must name `api.DOMAIN` and
    /// `*.DOMAIN` (a wildcard certificate).
    pub cert: PathBuf,
    /// The certificate's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// An API key and its tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// The bearer token.
    pub key: String,
    /// The tenant requests with this key are accounted to.
    pub tenant: String,
    /// An operator key: it sees and may cancel every tenant's executions, audit and
    /// statistics (each such use is itself recorded). Default `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
    /// Isolation levels this key's tenant may use; default the server's
    /// `allowed_levels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_levels: Option<Vec<IsolationLevel>>,
    /// Network policies this key's tenant may ask for; default the server's
    /// `allowed_networks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_networks: Option<Vec<NetworkKind>>,
    /// Whether this key's allowlists may name private and shared address ranges;
    /// default `[egress] allow_private`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_private: Option<bool>,
}

impl ApiKey {
    /// A plain (non-operator) key with the server's allowances.
    pub fn new(key: impl Into<String>, tenant: impl Into<String>) -> ApiKey {
        ApiKey {
            key: key.into(),
            tenant: tenant.into(),
            admin: false,
            allowed_levels: None,
            allowed_networks: None,
            allow_private: None,
        }
    }
}

/// Where `/metrics` is served, from [`ServerConfig::metrics`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAccess {
    /// On the API's address, to anyone.
    Open,
    /// On the API's address, to operator keys only.
    Operator,
    /// On an address of its own, and not on the API's.
    Listen(std::net::SocketAddr),
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7878".into(),
            api_keys: Vec::new(),
            allowed_levels: None,
            allowed_networks: None,
            max_body_bytes: 1 << 20,
            max_file_bytes: 64 << 20,
            result_retention_s: 600,
            max_results: 10_000,
            max_result_bytes: 256 << 20,
            max_result_bytes_per_tenant: 64 << 20,
            max_requests_per_tenant: 256,
            max_websockets_per_tenant: 64,
            close_linger_ms: 100,
            header_read_timeout_ms: 5_000,
            body_read_timeout_ms: 30_000,
            max_unauthenticated_connections: 4096,
            max_unauthenticated_connections_per_address: 256,
            metrics: "api".into(),
            drain_ms: 10_000,
            require_engines: false,
            workers: 2,
            tls: None,
        }
    }
}

impl ServerConfig {
    /// What each tenant may use: the server's `allowed_*` (or, when unset, everything
    /// without API keys and [`Allowed::multi_tenant_default`] with them), overridden
    /// per key.
    pub fn access_rules(&self) -> AccessRules {
        let base = if self.api_keys.is_empty() {
            Allowed::all()
        } else {
            Allowed::multi_tenant_default()
        };
        let default = Allowed {
            levels: self.allowed_levels.clone(),
            networks: self.allowed_networks.clone(),
            private: None,
        }
        .or(&base);
        let tenants = self
            .api_keys
            .iter()
            .filter(|k| {
                k.allowed_levels.is_some()
                    || k.allowed_networks.is_some()
                    || k.allow_private.is_some()
            })
            .map(|k| {
                (
                    k.tenant.clone(),
                    Allowed {
                        levels: k.allowed_levels.clone(),
                        networks: k.allowed_networks.clone(),
                        private: k.allow_private,
                    },
                )
            })
            .collect();
        AccessRules { default, tenants }
    }

    /// Where `/metrics` is served (`server.metrics` checked).
    pub fn metrics_access(&self) -> Result<MetricsAccess> {
        match self.metrics.as_str() {
            "api" => Ok(MetricsAccess::Open),
            "operator" => Ok(MetricsAccess::Operator),
            other => other.parse().map(MetricsAccess::Listen).map_err(|_| {
                Error::invalid_config(
                    "server.metrics",
                    format!(
                        "`{other}` is not `api`, `operator` or an ADDR:PORT such as 127.0.0.1:9464"
                    ),
                )
            }),
        }
    }

    /// Checks the values; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(Error::invalid_config(
                "server.listen",
                format!(
                    "`{}` is not ADDR:PORT (for example 127.0.0.1:7878)",
                    self.listen
                ),
            ));
        }
        if let Some(tls) = &self.tls {
            let Ok(at) = tls.listen.parse::<std::net::SocketAddr>() else {
                return Err(Error::invalid_config(
                    "server.tls.listen",
                    format!(
                        "`{}` is not ADDR:PORT (for example 0.0.0.0:443)",
                        tls.listen
                    ),
                ));
            };
            if at.port() != 0 && self.listen.parse::<std::net::SocketAddr>().ok() == Some(at) {
                return Err(Error::invalid_config(
                    "server.tls.listen",
                    "is server.listen's address; give the TLS listener another port",
                ));
            }
            for (field, path) in [("server.tls.cert", &tls.cert), ("server.tls.key", &tls.key)] {
                if !path.is_absolute() {
                    return Err(Error::invalid_config(
                        field,
                        format!("`{}` must be an absolute path", path.display()),
                    ));
                }
            }
        }
        let mut tenants_of_keys: BTreeMap<&str, (usize, bool)> = BTreeMap::new();
        for (i, k) in self.api_keys.iter().enumerate() {
            if k.key.len() < 16 {
                return Err(Error::invalid_config(
                    &format!("server.api_keys[{i}].key"),
                    "must be at least 16 characters",
                ));
            }
            if k.tenant.is_empty() || k.tenant.len() > 256 {
                return Err(Error::invalid_config(
                    &format!("server.api_keys[{i}].tenant"),
                    "must be 1 to 256 characters",
                ));
            }
            let has_rules = k.allowed_levels.is_some() || k.allowed_networks.is_some();
            if let Some((first, first_rules)) = tenants_of_keys.insert(&k.tenant, (i, has_rules)) {
                if first_rules || has_rules {
                    return Err(Error::invalid_config(
                        &format!("server.api_keys[{i}]"),
                        format!(
                            "tenant `{}` also has key {first}: give allowed_levels / allowed_networks on one key per tenant only",
                            k.tenant
                        ),
                    ));
                }
            }
        }
        if self.metrics_access()? == MetricsAccess::Operator
            && !self.api_keys.iter().any(|k| k.admin)
        {
            return Err(Error::invalid_config(
                "server.metrics",
                "`operator` serves /metrics to operator keys only, and no key has `admin = true`; add one, or use `api` or an ADDR:PORT",
            ));
        }
        for (name, v) in [
            ("server.max_body_bytes", self.max_body_bytes),
            ("server.max_file_bytes", self.max_file_bytes),
            ("server.max_results", self.max_results),
            (
                "server.max_requests_per_tenant",
                self.max_requests_per_tenant as usize,
            ),
            (
                "server.max_websockets_per_tenant",
                self.max_websockets_per_tenant as usize,
            ),
            ("server.workers", self.workers),
            (
                "server.max_unauthenticated_connections",
                self.max_unauthenticated_connections as usize,
            ),
            (
                "server.max_unauthenticated_connections_per_address",
                self.max_unauthenticated_connections_per_address as usize,
            ),
        ] {
            if v == 0 {
                return Err(Error::invalid_config(name, "must be greater than 0"));
            }
        }
        if self.close_linger_ms > 60_000 {
            return Err(Error::invalid_config(
                "server.close_linger_ms",
                format!(
                    "{} ms is too long: at most 60000 (a minute)",
                    self.close_linger_ms
                ),
            ));
        }
        for (name, v, max) in [
            (
                "server.header_read_timeout_ms",
                self.header_read_timeout_ms,
                600_000,
            ),
            (
                "server.body_read_timeout_ms",
                self.body_read_timeout_ms,
                3_600_000,
            ),
        ] {
            if v == 0 || v > max {
                return Err(Error::invalid_config(
                    name,
                    format!("{v} ms: give 1 to {max} ms"),
                ));
            }
        }
        if self.max_unauthenticated_connections_per_address > self.max_unauthenticated_connections {
            return Err(Error::invalid_config(
                "server.max_unauthenticated_connections_per_address",
                format!(
                    "must be at most server.max_unauthenticated_connections ({})",
                    self.max_unauthenticated_connections
                ),
            ));
        }
        if self.workers > 64 {
            return Err(Error::invalid_config(
                "server.workers",
                "must be at most 64",
            ));
        }
        if self.max_result_bytes_per_tenant == 0
            || self.max_result_bytes_per_tenant > self.max_result_bytes
        {
            return Err(Error::invalid_config(
                "server.max_result_bytes_per_tenant",
                format!(
                    "must be in 1..=server.max_result_bytes ({})",
                    self.max_result_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Sizing, waiting and recycling of an engine pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Instances kept ready ahead of need, at most `max_size`. Default 8: a burst of
    /// eight opens that comes after a quiet time finds them ready (each holds its
    /// warm interpreters, about 11–12 MiB of PSS on the subprocess and container
    /// engines; see `docs/configuration.md`). With 0 the pool keeps none, whatever
    /// `burst_idle_max` says.
    pub min_idle: usize,
    /// Most instances kept ready for the next burst: after `k` instances were in use
    /// at once (a burst of `k` opens, say; callers one after another need one or
    /// two), the pool keeps up to `k` idle (created in the background, in parallel)
    /// until `idle_timeout_ms` passes without as many in use; `min_idle` is the
    /// floor. Default 8; 0 keeps only `min_idle`.
    pub burst_idle_max: usize,
    /// Most instances of one pool at once (open sandboxes and running executions
    /// each hold one). Default: from the host, the lower of its memory / 64 MiB and
    /// its cores × 128, within 16..=4096 (256 on 2 cores and 24 GiB; see
    /// [`crate::host::HostFacts::pool_max_size`]).
    pub max_size: usize,
    /// Most callers queued for an instance; beyond it `POOL_EXHAUSTED` at once.
    /// Default 1024.
    pub max_waiting: usize,
    /// How long a queued caller waits before `POOL_EXHAUSTED`. Default 5000 ms.
    pub acquire_timeout_ms: u64,
    /// An instance is retired after this many executions. Default 1000.
    pub max_executions_per_engine: u64,
    /// An instance is retired this long after creation. Default 600000 ms.
    pub max_age_ms: u64,
    /// Idle instances above `min_idle` are reaped after this long. Default 60000 ms.
    pub idle_timeout_ms: u64,
    /// Consecutive creation failures that open the circuit breaker. Default 5.
    pub failure_threshold: u32,
    /// First backoff after the breaker opens; doubles up to `backoff_max_ms`.
    /// Default 200 ms.
    pub backoff_initial_ms: u64,
    /// Longest backoff. Default 30000 ms.
    pub backoff_max_ms: u64,
    /// Creating an instance that takes longer fails (and counts for the breaker).
    /// Default 30000 ms.
    pub create_timeout_ms: u64,
    /// Recycling (the health check) that takes longer retires the instance.
    /// Default 10000 ms.
    pub recycle_timeout_ms: u64,
    /// How long past an execution's deadline the engine may take to return before
    /// the supervisor reports `timed_out` and retires the instance. Default 10000 ms
    /// (longer than an engine's own output grace after a kill, so a slow subscriber
    /// is not mistaken for a stuck engine).
    pub watchdog_grace_ms: u64,
    /// Instances a pool keeps parked for executions that ended `suspended`, waiting
    /// for their resume; each holds one of the pool's `max_size` slots (so at most
    /// `max_size` are parked, whatever this says). Parking one
    /// more retires the longest-parked instance (its token then answers
    /// `NOT_FOUND`, saying it expired). 0 retires a suspended execution's instance at
    /// once, so pooled executions cannot be resumed. Default 4.
    pub max_suspended: usize,
    /// A parked instance is retired this long after its execution suspended.
    /// Default 600000 ms.
    pub suspend_ttl_ms: u64,
    /// An open sandbox nobody used for this long (no call on it, no execution in
    /// it) is destroyed. Default 1800000 ms (30 min); 0 never.
    pub sandbox_idle_timeout_ms: u64,
    /// An open sandbox is destroyed this long after it was opened, used or not.
    /// Default 86400000 ms (24 h); 0 never.
    pub sandbox_max_lifetime_ms: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            min_idle: 8,
            burst_idle_max: 8,
            max_size: crate::host::HostFacts::this_host().pool_max_size(),
            max_waiting: 1024,
            acquire_timeout_ms: 5_000,
            max_executions_per_engine: 1_000,
            max_age_ms: 600_000,
            idle_timeout_ms: 60_000,
            failure_threshold: 5,
            backoff_initial_ms: 200,
            backoff_max_ms: 30_000,
            create_timeout_ms: 30_000,
            recycle_timeout_ms: 10_000,
            watchdog_grace_ms: 10_000,
            max_suspended: 4,
            suspend_ttl_ms: 600_000,
            sandbox_idle_timeout_ms: 1_800_000,
            sandbox_max_lifetime_ms: 86_400_000,
        }
    }
}

impl PoolConfig {
    /// Checks the values; the error names the first bad field.
    pub fn validate(&self, prefix: &str) -> Result<()> {
        let field = |name: &str| format!("{prefix}.{name}");
        if self.max_size == 0 || self.max_size > 100_000 {
            return Err(Error::invalid_config(
                &field("max_size"),
                "must be in 1..=100000",
            ));
        }
        if self.min_idle > 100_000 {
            return Err(Error::invalid_config(
                &field("min_idle"),
                "must be at most 100000 (the pool keeps at most max_size ready)",
            ));
        }
        if self.max_waiting > 1_000_000 {
            return Err(Error::invalid_config(
                &field("max_waiting"),
                "must be at most 1000000",
            ));
        }
        for (name, v) in [
            ("acquire_timeout_ms", self.acquire_timeout_ms),
            ("max_executions_per_engine", self.max_executions_per_engine),
            ("max_age_ms", self.max_age_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("backoff_initial_ms", self.backoff_initial_ms),
            ("backoff_max_ms", self.backoff_max_ms),
            ("create_timeout_ms", self.create_timeout_ms),
            ("recycle_timeout_ms", self.recycle_timeout_ms),
            ("watchdog_grace_ms", self.watchdog_grace_ms),
            ("suspend_ttl_ms", self.suspend_ttl_ms),
        ] {
            if v == 0 {
                return Err(Error::invalid_config(
                    &field(name),
                    "must be greater than 0",
                ));
            }
        }
        if self.failure_threshold == 0 {
            return Err(Error::invalid_config(
                &field("failure_threshold"),
                "must be greater than 0",
            ));
        }
        if self.backoff_initial_ms > self.backoff_max_ms {
            return Err(Error::invalid_config(
                &field("backoff_initial_ms"),
                "must not exceed backoff_max_ms",
            ));
        }
        Ok(())
    }
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

/// Which OCI runtime the container engine drives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OciRuntime {
    /// crun when it can run a container here, runc otherwise.
    #[default]
    Auto,
    /// crun only.
    Crun,
    /// runc only.
    Runc,
    /// gVisor's `runsc` only: a user-space kernel between the program and the host's
    /// (never chosen by `auto`; see `container.runsc_platform`).
    Runsc,
}

/// The platform gVisor's `runsc` intercepts system calls with
/// (`container.runsc_platform`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunscPlatform {
    /// `ptrace`: works everywhere, about 20–30 µs a system call.
    #[default]
    Ptrace,
    /// `kvm`: needs a usable `/dev/kvm` (hardware virtualisation, not a nested
    /// software hypervisor).
    Kvm,
    /// `systrap`: newer runsc releases only.
    Systrap,
}

impl RunscPlatform {
    /// The value of runsc's `--platform` flag.
    pub fn as_str(self) -> &'static str {
        match self {
            RunscPlatform::Ptrace => "ptrace",
            RunscPlatform::Kvm => "kvm",
            RunscPlatform::Systrap => "systrap",
        }
    }
}

/// How many user and group ids each sandbox's user namespace maps
/// (`container.user_namespace`): ids 0 to 65535 inside.
pub const USERNS_IDS_PER_SANDBOX: u32 = 65536;

/// The variables the container engine sets in every container itself (`PATH` for the
/// container's root, `HOME` and `PWD` in the workdir, `TMPDIR`); they are never taken
/// from the host, so `container.env_passthrough` may not name them. A request's `env`
/// may still set them.
pub const CONTAINER_OWN_ENV: &[&str] = &["PATH", "HOME", "PWD", "TMPDIR"];

/// Settings of the OCI container engine (`strict` isolation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContainerConfig {
    /// Whether the engine is started when an OCI runtime is found. Default `true`;
    /// a host without a usable runtime leaves the engine out (`paddock doctor` says
    /// why).
    pub enabled: bool,
    /// The runtime. Default `auto`.
    pub runtime: OciRuntime,
    /// The runtime binary, overriding the search on `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_path: Option<PathBuf>,
    /// The containers' root filesystem, used read-only. Default: a generated root
    /// with the host's `/usr` and `/etc` bound read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,
    /// Where workdirs, bundles and the runtime's state live. Default: the system
    /// temp dir.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir_root: Option<PathBuf>,
    /// CPU quota per container, in CPUs (`1.5` = one and a half). Default 1.
    pub cpus: f64,
    /// Whether the seccomp profile is applied. Default `true`.
    pub seccomp: bool,
    /// Host variables a container receives, by exact name. Default: none.
    ///
    /// A container sees only these host variables (those the host has set when the
    /// engine starts), the variables the engine sets itself ([`CONTAINER_OWN_ENV`])
    /// and the request's `env`; the rest of the host's environment never reaches
    /// it, whatever the names. Names must not contain `=` or NUL, and may not be one
    /// of [`CONTAINER_OWN_ENV`].
    pub env_passthrough: Vec<String>,
    /// Keep a warm container per sandbox, with `paddock-agent` as its pid 1, and run
    /// executions in it as a frame round trip. Default `true` (when the agent binary
    /// is found).
    pub warm: bool,
    /// Warm Python and JavaScript interpreters inside each warm container, started
    /// by its agent on a sandbox's first snippet of the language and kept for the
    /// snippets that follow (the subprocess engine's runners and rules: one tenant
    /// per runner, `max_turns`, `max_age_ms`, `max_rss_bytes`). Default: on, for
    /// `["python", "javascript"]`. Not with `runtime = "runsc"`.
    pub runners: WarmConfig,
    /// The `paddock-agent` binary. Default: beside the running executable (or one
    /// directory up), else on `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_path: Option<PathBuf>,
    /// Give every container a user namespace: uid and gid 0 inside are an
    /// unprivileged id of the host, of a range of [`USERNS_IDS_PER_SANDBOX`] ids the
    /// engine allocates to the sandbox, and the sandbox's workdir is owned by it.
    /// Default `true`. Not applied with `runtime = "runsc"` (gVisor's kernel stands
    /// between the program and the host instead).
    pub user_namespace: bool,
    /// The first host id of the user-namespace ranges: sandbox slot `k` maps ids 0 to
    /// 65535 inside to `userns_first_id + k * 65536` and up. Default 2000000000 (above
    /// the ranges `/etc/subuid` hands out to users, below 2^31). Paddock processes
    /// sharing a host share the slots (a slot is locked while a sandbox holds it).
    pub userns_first_id: u32,
    /// How many ranges (sandboxes with a user namespace at once, across the Paddock
    /// processes of the host) there are. Default 1024.
    pub userns_slots: u32,
    /// The platform of `runtime = "runsc"`: `ptrace` (default), `kvm` or `systrap`
    /// (newer runsc releases).
    pub runsc_platform: RunscPlatform,
    /// The egress gateway's settings: the top-level `[egress]`, handed to the engine
    /// when Paddock makes it (not a setting of `[container]`).
    #[serde(skip)]
    pub egress: EgressConfig,
}

impl Default for ContainerConfig {
    fn default() -> Self {
        ContainerConfig {
            enabled: true,
            runtime: OciRuntime::Auto,
            runtime_path: None,
            rootfs: None,
            workdir_root: None,
            cpus: 1.0,
            seccomp: true,
            env_passthrough: Vec::new(),
            warm: true,
            runners: WarmConfig::default(),
            agent_path: None,
            user_namespace: true,
            userns_first_id: 2_000_000_000,
            userns_slots: 1024,
            runsc_platform: RunscPlatform::Ptrace,
            egress: EgressConfig::default(),
        }
    }
}

impl ContainerConfig {
    /// Checks paths, ranges and variable names.
    pub fn validate(&self) -> Result<()> {
        check_env_names("container.env_passthrough", &self.env_passthrough)?;
        self.runners.validate("container.runners")?;
        if let Some(own) = self
            .env_passthrough
            .iter()
            .find(|n| CONTAINER_OWN_ENV.contains(&n.as_str()))
        {
            return Err(Error::invalid_config(
                "container.env_passthrough",
                format!(
                    "`{own}` is set by the container engine for the container itself and is never taken from the host; remove it, or set it in a request's env"
                ),
            ));
        }
        if self.userns_first_id == 0 {
            return Err(Error::invalid_config(
                "container.userns_first_id",
                "0 would map the containers' root to the host's root; use an unused range such as 2000000000",
            ));
        }
        if self.userns_slots == 0 {
            return Err(Error::invalid_config(
                "container.userns_slots",
                "must be at least 1",
            ));
        }
        // The last id of the last range must stay below 2^32 - 1 (`(uid_t) -1`).
        let last = u64::from(self.userns_first_id)
            + u64::from(self.userns_slots) * u64::from(USERNS_IDS_PER_SANDBOX);
        if last > u64::from(u32::MAX) {
            return Err(Error::invalid_config(
                "container.userns_slots",
                format!(
                    "{} ranges of {USERNS_IDS_PER_SANDBOX} ids from {} end past the largest id, {}; lower container.userns_first_id or container.userns_slots",
                    self.userns_slots,
                    self.userns_first_id,
                    u32::MAX - 1
                ),
            ));
        }
        if !(self.cpus.is_finite() && (0.01..=1024.0).contains(&self.cpus)) {
            return Err(Error::invalid_config(
                "container.cpus",
                format!("{} is out of range 0.01..=1024", self.cpus),
            ));
        }
        for (field, path) in [
            ("container.runtime_path", &self.runtime_path),
            ("container.rootfs", &self.rootfs),
            ("container.workdir_root", &self.workdir_root),
            ("container.agent_path", &self.agent_path),
        ] {
            if let Some(p) = path {
                if !p.is_absolute() {
                    return Err(Error::invalid_config(
                        field,
                        format!("`{}` must be an absolute path", p.display()),
                    ));
                }
            }
        }
        Ok(())
    }
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
    fn handlers_and_warm_workers_are_checked() {
        let c = PaddockConfig::from_toml_str(
            "[subprocess.warm]\nenabled = true\n[subprocess.handlers.sum]\ncommand = [\"node\", \"sum.js\"]\n",
        )
        .unwrap();
        assert!(c.subprocess.warm.enabled);
        assert_eq!(c.subprocess.handlers["sum"].command, ["node", "sum.js"]);
        for (doc, field) in [
            (
                "[subprocess.handlers.\"a b\"]\ncommand = [\"x\"]\n",
                "subprocess.handlers",
            ),
            (
                "[subprocess.handlers.x]\ncommand = []\n",
                "subprocess.handlers.x.command",
            ),
            (
                "[subprocess.warm]\nlanguages = [\"shell\"]\n",
                "subprocess.warm.languages",
            ),
            ("[subprocess.warm]\nmax_turns = 0\n", "subprocess.warm"),
            (
                "[container.runners]\nlanguages = [\"shell\"]\n",
                "container.runners.languages",
            ),
            (
                "[container.runners]\nmax_rss_bytes = 1\n",
                "container.runners",
            ),
        ] {
            let e = PaddockConfig::from_toml_str(doc).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig, "{doc}");
            assert!(e.message.contains(field), "{doc}: {e}");
        }
    }

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
    fn the_close_linger_is_bounded() {
        let c = PaddockConfig::from_toml_str("[server]\nclose_linger_ms = 2000\n").unwrap();
        assert_eq!(c.server.close_linger_ms, 2000);
        let e = PaddockConfig::from_toml_str("[server]\nclose_linger_ms = 60001\n").unwrap_err();
        assert!(
            e.message.contains("server.close_linger_ms"),
            "{}",
            e.message
        );
    }

    #[test]
    fn read_timeouts_and_unauthenticated_connection_caps_are_bounded() {
        let c = PaddockConfig::from_toml_str(
            "[server]\nbody_read_timeout_ms = 500\nheader_read_timeout_ms = 2000\n\
             max_unauthenticated_connections = 10\n\
             max_unauthenticated_connections_per_address = 10\n",
        )
        .unwrap();
        assert_eq!(c.server.body_read_timeout_ms, 500);
        assert_eq!(c.server.header_read_timeout_ms, 2000);
        for (toml, field) in [
            ("body_read_timeout_ms = 0", "server.body_read_timeout_ms"),
            ("body_read_timeout_ms = 3600001", "server.body_read_timeout_ms"),
            ("header_read_timeout_ms = 0", "server.header_read_timeout_ms"),
            (
                "max_unauthenticated_connections = 0",
                "server.max_unauthenticated_connections",
            ),
            (
                "max_unauthenticated_connections = 8\nmax_unauthenticated_connections_per_address = 9",
                "server.max_unauthenticated_connections_per_address",
            ),
        ] {
            let e = PaddockConfig::from_toml_str(&format!("[server]\n{toml}\n")).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig);
            assert!(e.message.contains(field), "{toml}: {}", e.message);
        }
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
    fn pool_values_are_checked() {
        let e = PaddockConfig::from_toml_str("[pool]\nmax_size = 0\n").unwrap_err();
        assert!(e.message.contains("pool.max_size"), "{}", e.message);
        let e = PaddockConfig::from_toml_str("[pool]\nmin_idle = 100001\n").unwrap_err();
        assert!(e.message.contains("pool.min_idle"), "{}", e.message);
        // Above max_size is allowed (the default 8 with a smaller pool): the pool
        // keeps max_size ready.
        let c = PaddockConfig::from_toml_str("[pool]\nmin_idle = 9\nmax_size = 2\n").unwrap();
        assert_eq!(c.pool.min_idle, 9);
        let c = PaddockConfig::from_toml_str("[pool]\nmax_size = 2\nmin_idle = 0\n").unwrap();
        assert_eq!(c.pool.max_size, 2);
    }

    #[test]
    fn limiter_and_policy_sections_are_checked() {
        let e =
            PaddockConfig::from_toml_str("[limiter]\nmax_executions_per_window = 0\n").unwrap_err();
        assert!(
            e.message.contains("limiter.max_executions_per_window"),
            "{}",
            e.message
        );
        let c = PaddockConfig::from_toml_str(
            "[limiter]\nmax_executions_per_window = 5\n\n[policy]\nmax_code_length = 10\ndisable = [\"warn-while-true\"]\n",
        )
        .unwrap();
        assert_eq!(c.limiter.max_executions_per_window, Some(5));
        assert_eq!(c.policy.max_code_length, 10);
        let e = PaddockConfig::from_toml_str("[policy]\nmax_lenght = 1\n").unwrap_err();
        assert!(e.message.contains("max_lenght"), "{}", e.message);
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
    fn user_namespace_ranges_and_the_runsc_platform_are_checked() {
        let c = PaddockConfig::from_toml_str(
            "[container]\nruntime = \"runsc\"\nrunsc_platform = \"kvm\"\nuserns_slots = 8\n",
        )
        .unwrap();
        assert_eq!(c.container.runtime, OciRuntime::Runsc);
        assert_eq!(c.container.runsc_platform, RunscPlatform::Kvm);
        assert_eq!(c.container.userns_slots, 8);
        assert!(c.container.user_namespace);
        for (doc, field) in [
            (
                "[container]\nuserns_first_id = 0\n",
                "container.userns_first_id",
            ),
            ("[container]\nuserns_slots = 0\n", "container.userns_slots"),
            (
                "[container]\nuserns_first_id = 4294950000\nuserns_slots = 1\n",
                "container.userns_slots",
            ),
            // The parser names the choices (a bad enum value carries no key).
            (
                "[container]\nrunsc_platform = \"vm\"\n",
                "`ptrace`, `kvm`, `systrap`",
            ),
        ] {
            let e = PaddockConfig::from_toml_str(doc).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig, "{doc}");
            assert!(e.message.contains(field), "{doc}: {e}");
        }
        // The last range may end at the largest id.
        let c = ContainerConfig {
            userns_first_id: u32::MAX - USERNS_IDS_PER_SANDBOX,
            userns_slots: 1,
            ..ContainerConfig::default()
        };
        assert!(c.validate().is_ok());
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

    #[test]
    fn named_engines_inherit_the_container_section_and_are_checked() {
        let c = PaddockConfig::from_toml_str(
            r#"
            [container]
            cpus = 2.0
            runtime = "crun"
            [engines.py311]
            kind = "container"
            rootfs = "/srv/rootfs/py311"
            [engines.gvisor]
            kind = "container"
            runtime = "runsc"
            "#,
        )
        .unwrap();
        let py = c.engines[&EngineName::new("py311").unwrap()].container_config(&c.container);
        assert_eq!(
            py.rootfs.as_deref(),
            Some(std::path::Path::new("/srv/rootfs/py311"))
        );
        assert_eq!((py.cpus, py.runtime), (2.0, OciRuntime::Crun));
        let gv = c.engines[&EngineName::new("gvisor").unwrap()].container_config(&c.container);
        assert_eq!((gv.rootfs, gv.runtime), (None, OciRuntime::Runsc));
        // A round trip keeps them.
        let text = toml::to_string(&c).unwrap();
        assert_eq!(PaddockConfig::from_toml_str(&text).unwrap(), c);

        for (text, names) in [
            (
                "[engines.container]\nkind = \"container\"",
                "built-in engine's name",
            ),
            ("[engines.x]\nkind = \"vm\"", "unknown variant `vm`"),
            ("[engines.x]\nrootfs = \"/r\"", "missing field `kind`"),
            (
                "[engines.x]\nkind = \"container\"\nmemory = 1",
                "unknown field `memory`",
            ),
            ("[engines.Bad]\nkind = \"container\"", "engine name"),
            (
                "[engines.x]\nkind = \"container\"\nrootfs = \"relative\"",
                "`engines.x.rootfs`",
            ),
            (
                "[engines.x]\nkind = \"container\"\ncpus = 0.0",
                "`engines.x.cpus`",
            ),
        ] {
            let e = PaddockConfig::from_toml_str(text).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig, "{text}");
            assert!(e.message.contains(names), "{text}: {e}");
        }
        // A template names an engine there is.
        let e = PaddockConfig::from_toml_str(
            "[engines.tiny]\nkind = \"container\"\n[templates.t]\nengine = \"tyni\"\n",
        )
        .unwrap_err();
        assert!(
            e.message.contains("`templates.t.engine`") && e.message.contains("tiny"),
            "{e}"
        );
        PaddockConfig::from_toml_str(
            "[engines.tiny]\nkind = \"container\"\n[templates.t]\nengine = \"tiny\"\n",
        )
        .unwrap();
        let many: String = (0..=MAX_ENGINE_DEFS)
            .map(|i| format!("[engines.e{i}]\nkind = \"container\"\n"))
            .collect();
        let e = PaddockConfig::from_toml_str(&many).unwrap_err();
        assert!(e.message.contains("at most 16"), "{e}");
    }

    #[test]
    fn the_tls_listener_is_checked() {
        let ok = "[server]\nlisten = \"127.0.0.1:7878\"\n[server.tls]\nlisten = \"0.0.0.0:443\"\ncert = \"/etc/paddock/cert.pem\"\nkey = \"/etc/paddock/key.pem\"\n";
        let c = PaddockConfig::from_toml_str(ok).unwrap();
        assert_eq!(c.server.tls.as_ref().unwrap().listen, "0.0.0.0:443");
        for (text, names) in [
            (ok.replace("0.0.0.0:443", "443"), "`server.tls.listen`"),
            (ok.replace("0.0.0.0:443", "127.0.0.1:7878"), "another port"),
            (
                ok.replace("/etc/paddock/key.pem", "key.pem"),
                "`server.tls.key`",
            ),
            (
                ok.replace("cert = \"/etc/paddock/cert.pem\"\n", ""),
                "missing field `cert`",
            ),
        ] {
            let e = PaddockConfig::from_toml_str(&text).unwrap_err();
            assert!(e.message.contains(names), "{text}: {e}");
        }
    }
}
