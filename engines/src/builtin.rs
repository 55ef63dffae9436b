//! The built-in engines, made from the configuration.
//!
//! The scheduler (`paddock-pool`) registers engines by name and knows none of their
//! types, nor this crate: the `paddock` crate's builder gives it a registry that asks
//! [`builtin`] for the engines the config enables; the scheduler adds the ones its
//! embedder registered, and keys its pools by [`EngineName`].

use std::sync::Arc;

use paddock_core::{Engine, EngineKind, EngineName, ErrorCode, PaddockConfig, Result};

use crate::container::ContainerEngine;
use crate::isolate::IsolateEngine;
use crate::subprocess::SubprocessEngine;

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

/// The names of the built-in engines that [`builtin`] makes, in its order.
pub const BUILTIN_NAMES: [EngineName; 3] = [
    EngineName::SUBPROCESS,
    EngineName::ISOLATE,
    EngineName::CONTAINER,
];

/// Makes every built-in engine that `config` enables and `wanted` accepts (by name),
/// then the engines `[engines.NAME]` defines, in name order.
///
/// Every engine gets the config's effective default limits. A container engine that
/// cannot start for want of a usable runtime (`ENGINE_FAILED`) is listed in
/// [`Builtin::unavailable`] instead of failing the whole; any other error (an invalid
/// section, say) is returned.
pub fn builtin(config: &PaddockConfig, wanted: impl Fn(&EngineName) -> bool) -> Result<Builtin> {
    let defaults = config.limits.effective_defaults();
    let mut made = Builtin::default();
    if config.subprocess.enabled && wanted(&EngineName::SUBPROCESS) {
        let mut settings = config.subprocess.clone();
        settings.egress = config.egress.clone();
        settings.egress.allow_private = Some(config.egress_private());
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
        settings.egress.allow_private = Some(config.egress_private());
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
                settings.egress.allow_private = Some(config.egress_private());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makes_only_what_the_config_enables_and_the_caller_wants() {
        let mut config = PaddockConfig::default();
        config.container.enabled = false;
        let made = builtin(&config, |_| true).unwrap();
        let names: Vec<_> = made.engines.iter().map(|e| e.name()).collect();
        assert_eq!(names, [EngineName::SUBPROCESS, EngineName::ISOLATE]);

        let made = builtin(&config, |n| *n != EngineName::SUBPROCESS).unwrap();
        let names: Vec<_> = made.engines.iter().map(|e| e.name()).collect();
        assert_eq!(names, [EngineName::ISOLATE]);

        config.isolate.enabled = false;
        config.subprocess.enabled = false;
        let made = builtin(&config, |_| true).unwrap();
        assert!(made.engines.is_empty() && made.unavailable.is_empty());
    }

    #[test]
    fn a_container_runtime_that_is_missing_is_unavailable_not_fatal() {
        let mut config = PaddockConfig::default();
        config.subprocess.enabled = false;
        config.isolate.enabled = false;
        config.container.runtime_path = Some("/nonexistent/oci-runtime".into());
        let made = builtin(&config, |_| true).unwrap();
        assert!(made.engines.is_empty());
        assert_eq!(made.unavailable.len(), 1, "{:?}", made.unavailable);
        assert_eq!(made.unavailable[0].0, EngineName::CONTAINER);
        assert!(
            made.unavailable[0]
                .1
                .contains("container engine cannot start"),
            "{:?}",
            made.unavailable
        );
    }

    #[test]
    fn named_engines_come_after_the_built_ins_under_their_own_names() {
        let mut config = PaddockConfig::from_toml_str(
            "[engines.tiny]\nkind = \"container\"\nruntime_path = \"/nonexistent/oci-runtime\"\n",
        )
        .unwrap();
        config.container.enabled = false;
        config.isolate.enabled = false;
        let made = builtin(&config, |_| true).unwrap();
        let names: Vec<_> = made.engines.iter().map(|e| e.name()).collect();
        assert_eq!(names, [EngineName::SUBPROCESS]);
        // The section's engine runs with `[container]` disabled; here it cannot (no
        // runtime at that path), and says so under its own name.
        assert_eq!(made.unavailable.len(), 1, "{:?}", made.unavailable);
        assert_eq!(made.unavailable[0].0, "tiny");
        assert!(
            made.unavailable[0]
                .1
                .contains("container engine `tiny` cannot start"),
            "{:?}",
            made.unavailable
        );
        // And it is left out like a built-in when not wanted.
        let made = builtin(&config, |n| *n != "tiny").unwrap();
        assert!(made.unavailable.is_empty(), "{:?}", made.unavailable);
    }
}
