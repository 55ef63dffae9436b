//! The conformance suite against the subprocess engine: one `#[test]` per case.

use std::sync::Arc;

use paddock_core::{Engine, SubprocessConfig};
use paddock_engines::subprocess::SubprocessEngine;

/// A fresh subprocess engine with the default configuration.
pub(crate) fn subprocess_engine() -> Arc<dyn Engine> {
    Arc::new(
        SubprocessEngine::new(&SubprocessConfig::default())
            .expect("the subprocess engine must start with the default configuration"),
    )
}

paddock_conformance::conformance_tests!(conformance, || async { subprocess_engine() });
