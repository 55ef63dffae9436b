//! The built-in engines, made from the configuration.
//!
//! The scheduler (`paddock-pool`) registers engines by name and knows none of their
//! types, nor this crate: the `paddock` crate's builder gives it a registry that holds
//! the engines' part of the configuration ([`BuiltinConfig`]) and asks [`builtin`]
//! for the engines it enables; the scheduler adds the ones its embedder registered,
//! and keys its pools by [`EngineName`].

use std::collections::BTreeMap;
use std::sync::Arc;

use paddock_core::{Engine, EngineName, ErrorCode, Limits, Result};

use crate::container::ContainerEngine;
use crate::isolate::IsolateEngine;
use crate::subprocess::SubprocessEngine;
use crate::{
    ContainerConfig, EgressConfig, EngineDef, EngineKind, IsolateConfig, SubprocessConfig,
};

/// The built-in engines [`builtin`] made, and the ones it could not.
#[derive(Debug, Default)]
pub struct Builtin {
    /// The engines that started, in the order subprocess, isolate, container.
    pub engines: Vec<Arc<dyn Engine>>,
    /// The engines the config enables that cannot run on this host, and why (for
    /// instance a host without a usable OCI runtime). The others run without them;
    /// `paddock doctor` says the same.
    pub unavailable: Vec<(EngineName, String)>,
}

/// What the built-in engines read of the configuration: their sections, by the names
/// they have in the file, and what the whole document decides for them.
///
/// `paddock::PaddockConfig::builtin` makes one from the whole document.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BuiltinConfig {
    /// The default limits of every execution (`[limits]` over the built-in ones).
    pub defaults: Limits,
    /// The subprocess engine (`[subprocess]`).
    pub subprocess: SubprocessConfig,
    /// The QuickJS isolate engine (`[isolate]`).
    pub isolate: IsolateConfig,
    /// The OCI container engine (`[container]`), and the base of every
    /// `[engines.NAME]` section.
    pub container: ContainerConfig,
    /// The egress gateway (`[egress]`), with `allow_private` decided: every engine
    /// with a network gets it.
    pub egress: EgressConfig,
    /// The engines of names of their own (`[engines.NAME]`).
    pub engines: BTreeMap<EngineName, EngineDef>,
}

/// The names of the built-in engines that [`builtin`] makes, in its order.
pub const BUILTIN_NAMES: [EngineName; 3] = [
    EngineName::SUBPROCESS,
    EngineName::ISOLATE,
    EngineName::CONTAINER,
];

/// Makes every built-in engine that `config` enables and `wanted` accepts (by name),
/// then the engines `[engines.NAME]` defines, in name order.
///
/// Every engine gets the config's effective default limits, and the network ones its
/// `[egress]`. A container engine that
/// cannot start for want of a usable runtime (`ENGINE_FAILED`) is listed in
/// [`Builtin::unavailable`] instead of failing the whole; any other error (an invalid
/// section, say) is returned.
pub fn builtin(config: &BuiltinConfig, wanted: impl Fn(&EngineName) -> bool) -> Result<Builtin> {
    let defaults = config.defaults.clone();
    let mut made = Builtin::default();
    if config.subprocess.enabled && wanted(&EngineName::SUBPROCESS) {
        let mut settings = config.subprocess.clone();
        settings.egress = config.egress.clone();
        let engine = SubprocessEngine::with_defaults(&settings, defaults.clone())?;
        made.engines.push(Arc::new(engine));
    }
    if config.isolate.enabled && wanted(&EngineName::ISOLATE) {
        made.engines.push(Arc::new(IsolateEngine::configured(
            &config.isolate,
            crate::isolate::HostModules::new(),
            defaults.clone(),
        )?));
    }
    if config.container.enabled && wanted(&EngineName::CONTAINER) {
        let mut settings = config.container.clone();
        settings.egress = config.egress.clone();
        match ContainerEngine::with_defaults(&settings, defaults.clone()) {
            Ok(engine) => made.engines.push(Arc::new(engine)),
            Err(e) if e.code == ErrorCode::EngineFailed => {
                tracing::warn!(error = %e, "the container engine is not available");
                made.unavailable.push((
                    EngineName::CONTAINER,
                    format!("the container engine cannot start: {}", e.message),
                ));
            }
            Err(e) => return Err(e),
        }
    }
    // The engines of names of their own, after the built-ins (so that a request
    // that names no engine is never routed to one: see the supervisor's choice).
    for (name, def) in &config.engines {
        if !wanted(name) {
            continue;
        }
        match def.kind {
            EngineKind::Container => {
                let mut settings = def.container_config(&config.container);
                settings.egress = config.egress.clone();
                match ContainerEngine::named(name.clone(), &settings, defaults.clone()) {
                    Ok(engine) => made.engines.push(Arc::new(engine)),
                    Err(e) if e.code == ErrorCode::EngineFailed => {
                        tracing::warn!(engine = %name, error = %e, "a container engine is not available");
                        made.unavailable.push((
                            name.clone(),
                            format!("the container engine `{name}` cannot start: {}", e.message),
                        ));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(made)
}
