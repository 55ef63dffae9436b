//! The conformance suite against the QuickJS isolate engine: one `#[test]` per case.

use std::sync::Arc;

use paddock_core::Engine;
use paddock_engines::isolate::IsolateEngine;

paddock_conformance::conformance_tests!(conformance, || async {
    Arc::new(
        IsolateEngine::with_defaults()
            .expect("the isolate engine must start with the default configuration"),
    ) as Arc<dyn Engine>
});
