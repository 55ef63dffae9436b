//! [`PaddockBuilder`]: the scheduler's builder over the whole configuration, with the
//! built-in engines.

use std::sync::Arc;
use std::time::Duration;

use paddock_core::{AccessRules, Engine, EngineName, Error};
use paddock_pool::audit::{AuditConfig, AuditEntry};
use paddock_pool::limiter::LimiterConfig;
use paddock_pool::policy::PolicyConfig;
use paddock_pool::streamer::StreamerConfig;
use paddock_pool::{EngineRegistry, MadeEngines, Paddock};
use paddock_telemetry::Telemetry;

use crate::PaddockConfig;

/// Configures and starts Paddock with the built-in engines: the scheduler's
/// [`paddock_pool::PaddockBuilder`], given the whole [`PaddockConfig`] at
/// [`start`](Self::start): the scheduler gets its part
/// ([`PaddockConfig::scheduler`]), the built-in engines' registry theirs
/// ([`PaddockConfig::builtin`]). Made by [`builder()`](crate::builder).
#[must_use]
#[derive(Debug, Default)]
pub struct PaddockBuilder {
    scheduler: paddock_pool::PaddockBuilder,
    config: PaddockConfig,
    registry: Option<Arc<dyn EngineRegistry>>,
    access: Option<AccessRules>,
}

impl PaddockBuilder {
    /// The configuration, the whole document. Default: the embedded defaults.
    pub fn config(mut self, config: PaddockConfig) -> Self {
        self.config = config;
        self
    }

    /// The registry that makes engines. Default: the built-in engines' registry
    /// ([`BuiltinEngines`]) with the config's sections (subprocess, isolate,
    /// container, and the config's `[engines.NAME]` sections).
    pub fn registry(mut self, registry: Arc<dyn EngineRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Registers an engine under its [`name`](Engine::name) (see
    /// [`paddock_pool::PaddockBuilder::engine`]): registered under a built-in name,
    /// it takes that engine's place.
    pub fn engine(mut self, engine: Arc<dyn Engine>) -> Self {
        self.scheduler = self.scheduler.engine(engine);
        self
    }

    /// Does not make the engine `name` of the [`registry`](Self::registry).
    pub fn without(mut self, name: EngineName) -> Self {
        self.scheduler = self.scheduler.without(name);
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

    /// The engine used when a request names none (see
    /// [`paddock_pool::PaddockBuilder::default_engine`]). Default: `subprocess` when
    /// it runs, else the first engine registered, else the registry's first.
    pub fn default_engine(mut self, kind: EngineName) -> Self {
        self.scheduler = self.scheduler.default_engine(kind);
        self
    }

    /// Policy rules. Default: the config's `[policy]` section (the built-in rules and
    /// a 100,000-character cap).
    pub fn policy(mut self, policy: PolicyConfig) -> Self {
        self.scheduler = self.scheduler.policy(policy);
        self
    }

    /// Rate and concurrency limits. Default: the config's `[limiter]` section (no
    /// limits).
    pub fn limiter(mut self, limiter: LimiterConfig) -> Self {
        self.scheduler = self.scheduler.limiter(limiter);
        self
    }

    /// The audit log. Default: the config's `[audit]` section (an in-memory ring of
    /// 10,000 entries, no file).
    pub fn audit(mut self, audit: AuditConfig) -> Self {
        self.scheduler = self.scheduler.audit(audit);
        self
    }

    /// A callback invoked once for every audit entry.
    pub fn on_audit(mut self, f: impl Fn(&AuditEntry) + Send + Sync + 'static) -> Self {
        self.scheduler = self.scheduler.on_audit(f);
        self
    }

    /// Output streaming buffers.
    pub fn streamer(mut self, streamer: StreamerConfig) -> Self {
        self.scheduler = self.scheduler.streamer(streamer);
        self
    }

    /// The telemetry handle the scheduler records into. Default: a Prometheus
    /// exporter (render it with [`Paddock::telemetry`]).
    pub fn telemetry(mut self, telemetry: Telemetry) -> Self {
        self.scheduler = self.scheduler.telemetry(telemetry);
        self
    }

    /// Which isolation levels and network policies each tenant may use. Default: the
    /// config's rules ([`PaddockConfig::access_rules`]): everything without API keys;
    /// with them, every level but `none` and every network but `unrestricted`,
    /// unless the operator allows them.
    pub fn access(mut self, rules: AccessRules) -> Self {
        self.access = Some(rules);
        self
    }

    /// How long a call through the handle polls for its answer before parking (see
    /// [`paddock_pool::PaddockBuilder::spin_before_park`]). Default 200 µs; zero
    /// turns it off.
    pub fn spin_before_park(mut self, budget: Duration) -> Self {
        self.scheduler = self.scheduler.spin_before_park(budget);
        self
    }

    /// Validates the whole configuration, starts the actors on their own thread and
    /// returns the handle.
    pub fn start(self) -> Result<Paddock, Error> {
        let config = self.config;
        config.validate()?;
        let registry = self
            .registry
            .unwrap_or_else(|| Arc::new(BuiltinEngines::new(&config)));
        let access = self.access.unwrap_or_else(|| config.access_rules());
        self.scheduler
            .config(config.scheduler())
            .registry(registry)
            .access(access)
            .start()
    }
}

/// The built-in engines' registry: [`paddock_engines::builtin`] makes what its
/// sections of the configuration enable.
#[derive(Debug, Clone, Default)]
pub struct BuiltinEngines {
    config: paddock_engines::BuiltinConfig,
}

impl BuiltinEngines {
    /// The registry of the built-in engines that `config` enables, with their
    /// sections of it.
    pub fn new(config: &PaddockConfig) -> BuiltinEngines {
        BuiltinEngines {
            config: config.builtin(),
        }
    }
}

impl EngineRegistry for BuiltinEngines {
    fn make(&self, wanted: &dyn Fn(&EngineName) -> bool) -> Result<MadeEngines, Error> {
        let made = paddock_engines::builtin(&self.config, wanted)?;
        Ok(MadeEngines {
            engines: made.engines,
            unavailable: made.unavailable,
        })
    }
}
