//! The conformance suite against the subprocess engine with warm workers on: the
//! JavaScript cases run on the warm Node runner, the handler cases on the conformance
//! handler, commands stay cold.

use std::sync::{Arc, OnceLock};

use paddock_core::Engine;
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::{HandlerConfig, SubprocessConfig};

/// The conformance handler, written once into a directory that lives for the run.
fn handler() -> HandlerConfig {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"));
    HandlerConfig {
        command: paddock_conformance::handler_command(dir.path())
            .expect("writing the conformance handler"),
    }
}

paddock_conformance::conformance_tests!(conformance, || async {
    let mut config = SubprocessConfig::default();
    config.warm.enabled = true;
    config
        .handlers
        .insert(paddock_conformance::HANDLER_NAME.into(), handler());
    Arc::new(
        SubprocessEngine::new(&config)
            .expect("the subprocess engine must start with warm workers on"),
    ) as Arc<dyn Engine>
});
