//! The conformance suite against the subprocess engine: one `#[test]` per case.

use std::sync::Arc;

use paddock_core::Engine;
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::SubprocessConfig;

/// A fresh subprocess engine with the default configuration, warm workers off: every
/// execution is a fresh process (the warm suite covers the default).
pub(crate) fn subprocess_engine() -> Arc<dyn Engine> {
    let mut config = SubprocessConfig::default();
    config.warm.enabled = false;
    Arc::new(
        SubprocessEngine::new(&config)
            .expect("the subprocess engine must start with warm workers off"),
    )
}

paddock_conformance::conformance_tests!(conformance, || async { subprocess_engine() });
