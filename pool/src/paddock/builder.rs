//! [`PaddockBuilder`]: the engines, by name, and the actors, started on their own thread.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use paddock_core::{Engine, EngineName, Error, ErrorCode};

use crate::clock::SystemClock;
use crate::shares::Shares;
use crate::streamer::{Streamer, StreamerConfig};
use crate::supervisor::{Shared, Supervisor, SupervisorParts};
use paddock_telemetry::Telemetry;

use crate::audit::{Audit, AuditConfig, AuditEntry, AuditLog};
use crate::config::SchedulerConfig;
use crate::limiter::{Limiter, LimiterConfig, LimiterCore};
use crate::policy::{Policy, PolicyConfig};
use super::registry::{EngineRegistry, MadeEngines};
use super::{Paddock, RuntimeHandle};

/// Why a builder without a registry cannot make what is asked of it, and what to do.
const NO_REGISTRY: &str = "this builder has no engine registry (a `PaddockBuilder` of `paddock-pool` makes no engine of its own): use the `paddock` crate's builder, `paddock::builder()`, for the built-in engines, or register one with `PaddockBuilder::engine`";

/// The engines to run, by name: those the registry makes that neither `without` nor
/// a registered engine of the same name displaces, then the registered ones; the default engine; and the engines the config enables that
/// cannot run on this host, with why.
#[allow(clippy::type_complexity)]
fn register_engines(
    config: &SchedulerConfig,
    registry: Option<&dyn EngineRegistry>,
    registered: Vec<Arc<dyn Engine>>,
    without: &[EngineName],
    default_engine: Option<EngineName>,
) -> Result<(Vec<Arc<dyn Engine>>, EngineName, Vec<(EngineName, String)>), Error> {
    let mut names = std::collections::BTreeSet::new();
    for engine in &registered {
        if config.named_engines.contains(&engine.name()) {
            return Err(Error::invalid_config(
                &format!("engines.{}", engine.name()),
                "an engine registered in code has this name; give the section another",
            ));
        }
        if !names.insert(engine.name()) {
            return Err(Error::invalid_config(
                "engines",
                format!(
                    "two engines are registered as `{}`; give each engine its own name",
                    engine.name()
                ),
            ));
        }
    }
    let first_registered = registered.first().map(|e| e.name());
    let made = match registry {
        Some(registry) => registry.make(&|name: &EngineName| {
            !without.contains(name) && !names.contains(name)
        })?,
        None => {
            // A section of `[engines]` is an engine to make, and nothing here makes it.
            if let Some(name) = config.named_engines.iter().find(|n| !without.contains(n)) {
                return Err(Error::invalid_config(
                    &format!("engines.{name}"),
                    format!("no engine can be made from this section: {NO_REGISTRY}"),
                ));
            }
            if registered.is_empty() {
                return Err(Error::new(
                    ErrorCode::InvalidConfig,
                    format!("no engine is registered: {NO_REGISTRY}"),
                ));
            }
            MadeEngines::default()
        }
    };
    // Not an `[engines.NAME]` one: those are had only by naming them.
    let first_made = made
        .engines
        .iter()
        .map(|e| e.name())
        .find(|n| !config.named_engines.contains(n));
    let mut engines = made.engines;
    engines.extend(registered);
    // With only engines of `[engines.NAME]`, the default is the one asked for.
    let named_default = default_engine
        .clone()
        .filter(|n| engines.iter().any(|e| e.name() == *n));
    let Some(first) = first_registered.or(first_made).or(named_default) else {
        if !made.unavailable.is_empty() {
            let why: Vec<&str> = made
                .unavailable
                .iter()
                .map(|(_, why)| why.as_str())
                .collect();
            return Err(Error::new(
                ErrorCode::EngineFailed,
                format!(
                    "no engine can run: {}; run `paddock doctor`",
                    why.join("; ")
                ),
            ));
        }
        let why = if config.named_engines.is_empty() {
            "no engine is enabled; enable the subprocess engine or add one"
        } else {
            "no engine is enabled but those of [engines], which requests get only by naming them; enable a built-in engine, or make one of them the default engine"
        };
        return Err(Error::invalid_config("engines", why));
    };
    let has = |name: &EngineName| engines.iter().any(|e| e.name() == *name);
    let default_engine = match default_engine {
        Some(name) if !has(&name) => {
            let hint = if registry.is_none() {
                format!("; {NO_REGISTRY}")
            } else {
                String::new()
            };
            return Err(Error::invalid_config(
                "default_engine",
                format!("`{name}` is not among the configured engines{hint}"),
            ));
        }
        Some(name) => name,
        None if has(&EngineName::SUBPROCESS) => EngineName::SUBPROCESS,
        None => first,
    };
    Ok((engines, default_engine, made.unavailable))
}

/// Configures and starts Paddock.
#[must_use]
pub struct PaddockBuilder {
    config: SchedulerConfig,
    registry: Option<Arc<dyn EngineRegistry>>,
    engines: Vec<Arc<dyn Engine>>,
    default_engine: Option<EngineName>,
    without: Vec<EngineName>,
    policy: Option<PolicyConfig>,
    limiter: Option<LimiterConfig>,
    audit: Option<AuditConfig>,
    on_audit: Option<crate::audit::OnLog>,
    streamer: StreamerConfig,
    telemetry: Option<Telemetry>,
    spin: Duration,
    access: Option<paddock_core::AccessRules>,
}

impl std::fmt::Debug for PaddockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaddockBuilder")
            .field("config", &self.config)
            .field("registry", &self.registry)
            .field("engines", &self.engines)
            .finish_non_exhaustive()
    }
}

impl Default for PaddockBuilder {
    fn default() -> Self {
        PaddockBuilder {
            config: SchedulerConfig::default(),
            registry: None,
            engines: Vec::new(),
            default_engine: None,
            without: Vec::new(),
            policy: None,
            limiter: None,
            audit: None,
            on_audit: None,
            streamer: StreamerConfig::default(),
            telemetry: None,
            spin: Duration::from_micros(200),
            access: None,
        }
    }
}

impl PaddockBuilder {
    /// The scheduler's configuration (limits, pool sizing, server, audit, limiter,
    /// policy, the names of the `[engines.NAME]` engines). Default: the embedded
    /// defaults. The `paddock` crate's builder takes the whole document instead, and
    /// gives this builder its part.
    pub fn config(mut self, config: SchedulerConfig) -> Self {
        self.config = config;
        self
    }

    /// The registry that makes the engines the configuration enables. Default: none,
    /// and only the engines registered with [`engine`](Self::engine) run. The
    /// `paddock` crate's `paddock::builder()` sets the built-in engines' registry
    /// (subprocess, isolate, container, and the config's `[engines.NAME]` sections),
    /// which holds their sections.
    pub fn registry(mut self, registry: Arc<dyn EngineRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Registers an engine under its [`name`](Engine::name). Requests choose it by
    /// that name (`"engine": "<name>"`), and its pools, metrics and audit entries
    /// carry it.
    ///
    /// The engines of the [`registry`](Self::registry) (the built-in `subprocess`,
    /// `isolate` and `container` with the `paddock` crate's builder) are ordinary
    /// entries, made from the config unless the config disables them or
    /// [`without`](Self::without) names them. An engine registered here under a
    /// built-in name takes that name's place: to give isolates Rust host functions,
    /// register an `IsolateEngine::with_modules(…)`. Two engines registered under one
    /// name are refused at [`start`](Self::start) with `INVALID_CONFIG`.
    pub fn engine(mut self, engine: Arc<dyn Engine>) -> Self {
        self.engines.push(engine);
        self
    }

    /// Does not make the engine `name` of the [`registry`](Self::registry).
    pub fn without(mut self, name: EngineName) -> Self {
        self.without.push(name);
        self
    }

    /// Does not start the built-in subprocess engine.
    pub fn without_subprocess(self) -> Self {
        self.without(EngineName::SUBPROCESS)
    }

    /// Does not start the built-in QuickJS isolate engine.
    pub fn without_isolate(self) -> Self {
        self.without(EngineName::ISOLATE)
    }

    /// Does not start the built-in OCI container engine. (Without this, the engine is
    /// started when the config enables it and the host has a runtime that can run a
    /// container; a host without one runs without it, and `paddock doctor` says why.)
    pub fn without_container(self) -> Self {
        self.without(EngineName::CONTAINER)
    }

    /// The engine used when a request names none and the engine provides the
    /// requested isolation level (otherwise the engine with the weakest level that
    /// provides it is chosen). Default: `subprocess` when it is registered, else the
    /// first engine registered with [`engine`](Self::engine), else the registry's
    /// first.
    pub fn default_engine(mut self, kind: EngineName) -> Self {
        self.default_engine = Some(kind);
        self
    }

    /// Policy rules. Default: the config's `[policy]` section (the built-in rules and
    /// a 100,000-character cap).
    pub fn policy(mut self, policy: PolicyConfig) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Rate and concurrency limits. Default: the config's `[limiter]` section (no
    /// limits).
    pub fn limiter(mut self, limiter: LimiterConfig) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// The audit log. Default: the config's `[audit]` section (an in-memory ring of
    /// 10,000 entries, no file).
    pub fn audit(mut self, audit: AuditConfig) -> Self {
        self.audit = Some(audit);
        self
    }

    /// A callback invoked once for every audit entry.
    pub fn on_audit(mut self, f: impl Fn(&AuditEntry) + Send + Sync + 'static) -> Self {
        self.on_audit = Some(Arc::new(f));
        self
    }

    /// Output streaming buffers.
    pub fn streamer(mut self, streamer: StreamerConfig) -> Self {
        self.streamer = streamer;
        self
    }

    /// The telemetry handle the scheduler records into. Default: a Prometheus
    /// exporter (render it with [`Paddock::telemetry`]).
    pub fn telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = Some(telemetry);
        self
    }

    /// Which isolation levels and network policies each tenant may use. Default: the
    /// config's `[server]` rules ([`SchedulerConfig::access_rules`]; the `paddock`
    /// crate's builder adds `[egress] allow_private`): everything without
    /// API keys; with them, every level but `none` and every network but
    /// `unrestricted`, unless the operator allows them.
    pub fn access(mut self, rules: paddock_core::AccessRules) -> Self {
        self.access = Some(rules);
        self
    }

    /// How long a call through the handle polls for its answer before parking, while
    /// recent answers came back within that time (see `spin.rs`). Default 200 µs;
    /// zero turns it off.
    pub fn spin_before_park(mut self, budget: Duration) -> Self {
        self.spin = budget;
        self
    }

    /// Validates everything, starts the actors on their own thread and returns the
    /// handle.
    pub fn start(self) -> Result<Paddock, Error> {
        self.config.validate()?;
        let limiter = self.limiter.unwrap_or_else(|| self.config.limiter.clone());
        limiter.validate()?;
        let audit = self.audit.unwrap_or_else(|| self.config.audit.clone());
        audit.validate()?;
        let policy = Arc::new(Policy::new(
            self.policy.unwrap_or_else(|| self.config.policy.clone()),
        )?);
        let (engines, default_engine, unavailable) = register_engines(
            &self.config,
            self.registry.as_deref(),
            self.engines,
            &self.without,
            self.default_engine,
        )?;
        let by_name_only: std::collections::HashSet<EngineName> =
            self.config.named_engines.iter().cloned().collect();
        let mut described: Vec<(EngineName, paddock_core::Capabilities)> = engines
            .iter()
            .map(|e| (e.name(), e.capabilities().clone()))
            .collect();
        described.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let described: Arc<[(EngineName, paddock_core::Capabilities)]> = described.into();
        let mut audit_log = AuditLog::new(audit)?;
        if let Some(cb) = self.on_audit {
            audit_log.set_on_log(cb);
        }
        // Under API keys, a tenant's pool slots default to its fair share.
        if self.config.server.require_engines && !unavailable.is_empty() {
            let why: Vec<&str> = unavailable.iter().map(|(_, why)| why.as_str()).collect();
            return Err(Error::new(
                ErrorCode::EngineFailed,
                format!(
                    "{} (server.require_engines is set: every enabled engine must run; run `paddock doctor`, or disable the engine)",
                    why.join("; ")
                ),
            ));
        }
        let parts_unavailable = unavailable.clone();
        let shares = Shares::new(&limiter, {
            let (each, fair) = self.config.slots_per_tenant();
            each.filter(|_| fair)
        });
        let limiter_core = LimiterCore::new(limiter, Arc::new(SystemClock))?;
        let shared = Arc::new(Shared::default());
        let parts_shared = shared.clone();
        let pool_config = self.config.pool.clone();
        let defaults = self.config.limits.effective_defaults();
        let ceilings = self.config.limits.ceilings();
        let access = self.access.unwrap_or_else(|| self.config.access_rules());
        let parts_access = access.clone();
        let access = Arc::new(access);

        let streamer_config = self.streamer;
        let self_spin = self.spin.min(Duration::from_millis(1));
        let telemetry = match self.telemetry {
            Some(t) => t,
            None => Telemetry::prometheus()
                .map_err(|e| Error::new(ErrorCode::InvalidConfig, format!("telemetry: {e}")))?,
        };
        let parts_telemetry = telemetry.clone();

        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("paddock-actors".into())
            .spawn(move || {
                let system = actix::System::new();
                system.block_on(async move {
                    let limiter = Limiter::new(limiter_core).start();
                    let audit = Audit::new(audit_log).start();
                    let streamer = Streamer::new(streamer_config).start();
                    let supervisor = Supervisor::from_parts(SupervisorParts {
                        engines,
                        default_engine,
                        unavailable: parts_unavailable,
                        by_name_only,
                        pool_config,
                        defaults,
                        policy,
                        limiter,
                        audit: audit.clone(),
                        streamer: streamer.clone(),
                        shared: parts_shared,
                        telemetry: parts_telemetry,
                        ceilings,
                        access: parts_access,
                        shares,
                    })
                    .start();
                    let _ = tx.send((
                        supervisor,
                        streamer,
                        audit.clone(),
                        actix::System::current(),
                        actix::Arbiter::current(),
                    ));
                });
                let _ = system.run();
            })
            .map_err(|e| Error::engine_io("starting the actor thread", e))?;
        let (supervisor, streamer, audit, system, arbiter) = rx
            .recv()
            .map_err(|_| Error::new(ErrorCode::EngineFailed, "the actor thread failed to start"))?;
        Ok(Paddock {
            supervisor,
            streamer,
            audit,
            shared,
            access,
            telemetry,
            capabilities: described,
            unavailable: unavailable.into(),
            prewarms: self.config.pool.min_idle > 0,
            max_pool_size: self.config.pool.max_size,
            federation: None,
            runtime: Arc::new(RuntimeHandle {
                spin: paddock_core::spin::Spin::new(self_spin),
                system,
                arbiter,
                thread: parking_lot::Mutex::new(Some(thread)),
            }),
        })
    }
}
