//! The conformance suite against the subprocess engine with warm workers on: the
//! JavaScript cases run on the warm Node runner, commands stay cold.

use std::sync::Arc;

use paddock_core::{Engine, SubprocessConfig};
use paddock_engines::subprocess::SubprocessEngine;

paddock_conformance::conformance_tests!(conformance, || async {
    let mut config = SubprocessConfig::default();
    config.warm.enabled = true;
    Arc::new(
        SubprocessEngine::new(&config)
            .expect("the subprocess engine must start with warm workers on"),
    ) as Arc<dyn Engine>
});
