//! The conformance suite against the container engine (crun, with runc as the
//! fallback), once more pinned to runc, once on gVisor's runsc, and once with warm
//! containers off (a container per execution).
//!
//! A host without a usable OCI runtime (for the `runsc` module: without gVisor's
//! runsc) skips these tests and says why, unless `PADDOCK_REQUIRE_CONTAINERS` is set
//! (as `.ci/run` does, which installs crun, runc and runsc), which makes them fail.

use std::sync::{Arc, OnceLock};

use paddock_core::Engine;
use paddock_engines::container::ContainerEngine;
use paddock_engines::{ContainerConfig, OciRuntime};

/// The engine passes only listed host variables; the suite's ordinary one is listed.
fn config(runtime: OciRuntime) -> ContainerConfig {
    ContainerConfig {
        runtime,
        env_passthrough: vec![paddock_conformance::LISTED_HOST_VAR.to_string()],
        ..ContainerConfig::default()
    }
}

fn cold_engine() -> Arc<dyn Engine> {
    let config = ContainerConfig {
        warm: false,
        ..config(OciRuntime::Auto)
    };
    Arc::new(ContainerEngine::new(&config).expect("the container engine starts"))
}

/// Whether the engine can start with `runtime`, found out once per runtime.
fn available(runtime: OciRuntime) -> Result<(), String> {
    static AUTO: OnceLock<Result<(), String>> = OnceLock::new();
    static RUNC: OnceLock<Result<(), String>> = OnceLock::new();
    static RUNSC: OnceLock<Result<(), String>> = OnceLock::new();
    let cell = match runtime {
        OciRuntime::Runc => &RUNC,
        OciRuntime::Runsc => &RUNSC,
        _ => &AUTO,
    };
    let found = cell
        .get_or_init(|| {
            ContainerEngine::new(&config(runtime))
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .clone();
    if let Err(why) = &found {
        if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() {
            panic!(
                "PADDOCK_REQUIRE_CONTAINERS is set, but the container engine cannot start: {why}"
            );
        }
    }
    found
}

fn container_engine(runtime: OciRuntime) -> Arc<dyn Engine> {
    Arc::new(ContainerEngine::new(&config(runtime)).expect("the container engine starts"))
}

paddock_conformance::conformance_tests!(
    conformance,
    || async { container_engine(OciRuntime::Auto) },
    requires = || available(OciRuntime::Auto),
);

mod runc {
    use super::*;
    paddock_conformance::conformance_tests!(
        conformance,
        || async { container_engine(OciRuntime::Runc) },
        requires = || available(OciRuntime::Runc),
    );
}

/// gVisor (`runsc`), warm containers on: its agent serves executions; processes,
/// terminals and TCP are not offered there, and their cases skip.
mod runsc {
    use super::*;
    paddock_conformance::conformance_tests!(
        conformance,
        || async { container_engine(OciRuntime::Runsc) },
        requires = || available(OciRuntime::Runsc),
    );
}

mod cold {
    use super::*;
    paddock_conformance::conformance_tests!(
        conformance,
        || async { cold_engine() },
        requires = || available(OciRuntime::Auto),
    );
}
